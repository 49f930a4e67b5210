//! SVG plots of a suite's records: throughput-latency curves per workload (the batch size
//! grows along each curve, as in GPHash's Figures 5 and 6) and a per-workload comparison of
//! the systems at one batch size.
//!
//! SVG only: plotters draws text into bitmaps (PNG) only through a font (font-kit with the
//! system's fontconfig, or a font file built in), which the bare machines the suite runs on
//! need not have.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::coord::combinators::{LogCoord, WithKeyPoints};
use plotters::coord::ranged1d::{AsRangedCoord, KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;

use crate::bench::runner::Record;
use crate::error::{Error, Result};

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn draw_error(e: impl std::fmt::Display) -> Error {
    Error::Io { what: "drawing a plot".into(), source: std::io::Error::other(e.to_string()) }
}

/// The distinct values of `items`, in order of first appearance.
fn distinct<'a>(items: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut seen: Vec<String> = vec![];
    for item in items {
        if !seen.contains(item) {
            seen.push(item.clone());
        }
    }
    seen
}

/// A tick label with two significant digits at most and no floating-point noise: 0.05, 0.2,
/// 1, 1.5, 20, 1500.
fn tick_label(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let decimals = (1 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// The ticks of a logarithmic axis over `range`: labelled ones at 1, 2 and 5 times the powers
/// of ten (every multiple where the range is too narrow for those), grid lines at every
/// multiple.
fn log_ticks(range: &Range<f64>) -> (Vec<f64>, Vec<f64>) {
    let (lo, hi) = (range.start, range.end);
    let decades = lo.log10().floor() as i32..=hi.log10().ceil() as i32;
    let multiples = |ms: &[u32]| -> Vec<f64> {
        decades
            .clone()
            .flat_map(|d| ms.iter().map(move |&m| m as f64 * 10f64.powi(d)))
            .filter(|v| (lo..=hi).contains(v))
            .collect()
    };
    let every = multiples(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let bold = multiples(&[1, 2, 5]);
    let bold = if bold.len() >= 3 || every.len() < 2 { bold } else { every.clone() };
    (bold, every)
}

/// A logarithmic axis over `range` with readable ticks.
fn log_axis(range: Range<f64>) -> WithKeyPoints<LogCoord<f64>> {
    let (bold, light) = log_ticks(&range);
    range.log_scale().with_key_points(bold).with_light_points(light)
}

/// The x axis of grouped bars: group `i` spans `i..i + 1` and is labelled `names[i]` at its
/// middle.
struct Groups(Vec<String>);

impl Ranged for Groups {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, (lo, hi): (i32, i32)) -> i32 {
        lo + ((hi - lo) as f64 * value / self.0.len() as f64).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _: Hint) -> Vec<f64> {
        (0..self.0.len()).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.0.len() as f64
    }
}

impl ValueFormatter<f64> for Groups {
    fn format_ext(&self, value: &f64) -> String {
        self.0.get(value.floor() as usize).cloned().unwrap_or_default()
    }
}

/// A white chart of `size` pixels drawn into the SVG file at `path`.
fn svg(path: &Path, size: (u32, u32)) -> Result<DrawingArea<SVGBackend<'_>, Shift>> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    Ok(root)
}

/// A chart with axes `X` and `Y` on an SVG file.
type Chart<'a, 'b, X, Y> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<<X as AsRangedCoord>::CoordDescType, <Y as AsRangedCoord>::CoordDescType>,
>;

/// The axes of a chart on `root`, captioned.
fn axes<'a, 'b, X: AsRangedCoord, Y: AsRangedCoord>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: String,
    x: X,
    y: Y,
) -> Result<Chart<'a, 'b, X, Y>> {
    ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)
        .map_err(draw_error)
}

/// Draws the legend at `position` and writes the file.
fn finish<'a, 'b: 'a, CT: CoordTranslate>(
    mut chart: ChartContext<'a, SVGBackend<'b>, CT>,
    root: &DrawingArea<SVGBackend<'b>, Shift>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(draw_error)?;
    root.present().map_err(draw_error)
}

/// Throughput against median batch latency of `workload` with `key_bytes`-byte keys, a curve
/// per system; `None` when fewer than two batch sizes were measured.
pub fn curves(records: &[Record], workload: &str, key_bytes: u32, dir: &Path) -> Result<Option<PathBuf>> {
    let rs: Vec<&Record> = records
        .iter()
        .filter(|r| r.workload == workload && r.key_bytes == key_bytes && r.ops_per_s > 0.0)
        .collect();
    if rs.iter().map(|r| r.batch).collect::<BTreeSet<_>>().len() < 2 {
        return Ok(None);
    }
    let path = dir.join(format!("curve-{workload}-{key_bytes}B.svg"));
    let point = |r: &Record| (r.p50_ms.max(1e-3), r.ops_per_s / 1e6);
    let (lat, ops): (Vec<f64>, Vec<f64>) = rs.iter().map(|r| point(r)).unzip();
    let x = lat.iter().copied().fold(f64::MAX, f64::min) / 1.5..lat.iter().copied().fold(0.0, f64::max) * 1.5;
    let y = ops.iter().copied().fold(f64::MAX, f64::min).max(1e-3) / 1.5
        ..ops.iter().copied().fold(0.0, f64::max) * 1.5;
    let root = svg(&path, (900, 600))?;
    let caption = format!("{workload}, {key_bytes}-byte keys: throughput vs batch latency");
    let mut chart = axes(&root, caption, log_axis(x), log_axis(y))?;
    chart
        .configure_mesh()
        .x_desc("median batch latency (ms)")
        .y_desc("throughput (M operations/s)")
        .x_label_formatter(&|v| tick_label(*v))
        .y_label_formatter(&|v| tick_label(*v))
        .draw()
        .map_err(draw_error)?;
    for (i, system) in distinct(rs.iter().map(|r| &r.system)).iter().enumerate() {
        let mut points: Vec<(usize, (f64, f64))> =
            rs.iter().filter(|r| &r.system == system).map(|r| (r.batch, point(r))).collect();
        points.sort_by_key(|p| p.0);
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.iter().map(|p| p.1), color.stroke_width(2)))
            .map_err(draw_error)?
            .label(system.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| Circle::new(p.1, 4, color.filled()))).map_err(draw_error)?;
    }
    finish(chart, &root, SeriesLabelPosition::LowerRight)?;
    drop(root);
    Ok(Some(path))
}

/// Throughput of every system on every workload at one batch size, as bars grouped by
/// workload.
pub fn comparison(records: &[Record], key_bytes: u32, batch: usize, dir: &Path) -> Result<Option<PathBuf>> {
    let rs: Vec<&Record> = records.iter().filter(|r| r.key_bytes == key_bytes && r.batch == batch).collect();
    if rs.is_empty() {
        return Ok(None);
    }
    let workloads = distinct(rs.iter().map(|r| &r.workload));
    let systems = distinct(rs.iter().map(|r| &r.system));
    let path = dir.join(format!("compare-{key_bytes}B-batch{batch}.svg"));
    let top = rs.iter().map(|r| r.ops_per_s / 1e6).fold(0.0, f64::max) * 2.0;
    let bottom = rs.iter().map(|r| r.ops_per_s / 1e6).filter(|v| *v > 0.0).fold(f64::MAX, f64::min) / 2.0;
    let (bottom, top) = (bottom.max(1e-3), top.max(1.0));
    let root = svg(&path, (1200, 600))?;
    let caption = format!("{key_bytes}-byte keys, batch {batch}: throughput per workload");
    let mut chart = axes(&root, caption, Groups(workloads.clone()), log_axis(bottom..top))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("workload")
        .y_desc("throughput (M operations/s)")
        .y_label_formatter(&|v| tick_label(*v))
        .draw()
        .map_err(draw_error)?;
    let width = 0.8 / systems.len() as f64;
    for (si, system) in systems.iter().enumerate() {
        let color = COLORS[si % COLORS.len()];
        let bars = workloads.iter().enumerate().filter_map(|(wi, w)| {
            let r = rs.iter().find(|r| &r.system == system && &r.workload == w)?;
            let x0 = wi as f64 + 0.1 + si as f64 * width;
            Some(Rectangle::new([(x0, bottom), (x0 + width, r.ops_per_s / 1e6)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(draw_error)?
            .label(system.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    finish(chart, &root, SeriesLabelPosition::UpperRight)?;
    drop(root);
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_are_short() {
        let labels: Vec<String> =
            [0.05, 0.2, 0.6000000000000001, 1.0, 1.5, 20.0, 1500.0].into_iter().map(tick_label).collect();
        assert_eq!(labels, ["0.05", "0.2", "0.6", "1", "1.5", "20", "1500"]);
    }

    #[test]
    fn log_ticks_label_every_decade_in_range() {
        let (bold, light) = log_ticks(&(0.065..45.0));
        let labels: Vec<String> = bold.into_iter().map(tick_label).collect();
        assert_eq!(labels, ["0.1", "0.2", "0.5", "1", "2", "5", "10", "20"]);
        assert_eq!(light.len(), 3 + 9 + 9 + 4);
        // A narrow range labels every multiple.
        let (bold, _) = log_ticks(&(2.2..4.5));
        assert_eq!(bold.into_iter().map(tick_label).collect::<Vec<_>>(), ["3", "4"]);
    }
}
