//! SVG plots: throughput-latency curves per workload (the batch size grows along each curve,
//! as in GPHash's Figures 5 and 6), grouped bars (the systems per workload at one batch size;
//! the cache's figures) and lines (the cache over time and under skew).
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

use crate::runner::Record;
use gphash::{Error, Result};

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
pub fn distinct<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> Vec<String> {
    let mut seen: Vec<String> = vec![];
    for item in items {
        if !seen.iter().any(|s| s == item.as_ref()) {
            seen.push(item.as_ref().to_string());
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
    let value = |w: usize, s: usize| {
        rs.iter().find(|r| r.system == systems[s] && r.workload == workloads[w]).map(|r| r.ops_per_s / 1e6)
    };
    let caption = format!("{key_bytes}-byte keys, batch {batch}: throughput per workload");
    grouped_bars(&path, caption, ("workload", &workloads), &systems, value)?;
    Ok(Some(path))
}

/// Bars of `value(group, series)` (M operations/s, log scale) grouped along the x axis:
/// `groups` is the axis' description and the groups' names.
pub fn grouped_bars(
    path: &Path,
    caption: String,
    (x_desc, groups): (&str, &[String]),
    series: &[String],
    value: impl Fn(usize, usize) -> Option<f64>,
) -> Result<()> {
    let all: Vec<f64> = (0..groups.len())
        .flat_map(|g| (0..series.len()).map(move |s| (g, s)))
        .filter_map(|(g, s)| value(g, s))
        .filter(|v| *v > 0.0)
        .collect();
    let top = all.iter().copied().fold(0.0, f64::max) * 2.0;
    let bottom = all.iter().copied().fold(f64::MAX, f64::min) / 2.0;
    let (bottom, top) = (bottom.clamp(1e-3, 1.0), top.max(1.0));
    let root = svg(path, (1200, 600))?;
    let mut chart = axes(&root, caption, Groups(groups.to_vec()), log_axis(bottom..top))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(x_desc)
        .y_desc("throughput (M operations/s)")
        .y_label_formatter(&|v| tick_label(*v))
        .draw()
        .map_err(draw_error)?;
    let width = 0.8 / series.len() as f64;
    for (si, name) in series.iter().enumerate() {
        let color = COLORS[si % COLORS.len()];
        let bars = (0..groups.len()).filter_map(|gi| {
            let v = value(gi, si)?;
            let x0 = gi as f64 + 0.1 + si as f64 * width;
            Some(Rectangle::new([(x0, bottom), (x0 + width, v)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(draw_error)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    finish(chart, &root, SeriesLabelPosition::UpperRight)
}

/// A line of [`lines`]: its name and points `(x, y, marked)`.
pub type Line = (String, Vec<(f64, f64, bool)>);

/// One line per series over linear axes (`x` and `y` describe them); points marked where
/// `marked` says so (e.g. batches during a loading phase).
pub fn lines(path: &Path, caption: String, (x_desc, y_desc): (&str, &str), series: &[Line]) -> Result<()> {
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (x1, y1) = points.fold((0.0f64, 0.0f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
    let x0 = series.iter().flat_map(|(_, p)| p.iter().map(|p| p.0)).fold(f64::MAX, f64::min).min(x1);
    let root = svg(path, (1000, 550))?;
    let mut chart = axes(&root, caption, x0..x1.max(x0 + 1e-9), 0.0..y1 * 1.15 + 1e-9)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| tick_label(*v))
        .y_label_formatter(&|v| tick_label(*v))
        .draw()
        .map_err(draw_error)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(pts.iter().map(|p| (p.0, p.1)), color.stroke_width(2)))
            .map_err(draw_error)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        let marked = pts.iter().filter(|p| p.2).map(|p| Circle::new((p.0, p.1), 3, RED.filled()));
        chart.draw_series(marked).map_err(draw_error)?;
    }
    finish(chart, &root, SeriesLabelPosition::LowerRight)
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
