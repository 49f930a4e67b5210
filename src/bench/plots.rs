//! SVG plots of a suite's records: throughput-latency curves per workload (the batch size
//! grows along each curve, as in GPHash's Figures 5 and 6) and a per-workload comparison of
//! the systems at one batch size.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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

fn systems(records: &[&Record]) -> Vec<String> {
    let mut seen = vec![];
    for r in records {
        if !seen.contains(&r.system) {
            seen.push(r.system.clone());
        }
    }
    seen
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
    let (lat, ops): (Vec<f64>, Vec<f64>) = rs.iter().map(|r| (r.p50_ms.max(1e-3), r.ops_per_s / 1e6)).unzip();
    let x = lat.iter().copied().fold(f64::MAX, f64::min) / 1.5..lat.iter().copied().fold(0.0, f64::max) * 1.5;
    let y = ops.iter().copied().fold(f64::MAX, f64::min).max(1e-3) / 1.5
        ..ops.iter().copied().fold(0.0, f64::max) * 1.5;
    let root = SVGBackend::new(&path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{workload}, {key_bytes}-byte keys: throughput vs batch latency"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x.log_scale(), y.log_scale())
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("median batch latency (ms)")
        .y_desc("throughput (M operations/s)")
        .draw()
        .map_err(draw_error)?;
    for (i, system) in systems(&rs).iter().enumerate() {
        let mut points: Vec<(f64, f64, usize)> = rs
            .iter()
            .filter(|r| &r.system == system)
            .map(|r| (r.p50_ms.max(1e-3), r.ops_per_s / 1e6, r.batch))
            .collect();
        points.sort_by_key(|p| p.2);
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.1)), color.stroke_width(2)))
            .map_err(draw_error)?
            .label(system.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|p| Circle::new((p.0, p.1), 4, color.filled())))
            .map_err(draw_error)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    drop(chart);
    drop(root);
    Ok(Some(path))
}

/// Throughput of every system on every workload at one batch size, as grouped bars.
pub fn comparison(records: &[Record], key_bytes: u32, batch: usize, dir: &Path) -> Result<Option<PathBuf>> {
    let rs: Vec<&Record> = records.iter().filter(|r| r.key_bytes == key_bytes && r.batch == batch).collect();
    if rs.is_empty() {
        return Ok(None);
    }
    let mut workloads: Vec<String> = vec![];
    for r in &rs {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload.clone());
        }
    }
    let systems = systems(&rs);
    let path = dir.join(format!("compare-{key_bytes}B-batch{batch}.svg"));
    let top = rs.iter().map(|r| r.ops_per_s / 1e6).fold(0.0, f64::max) * 2.0;
    let bottom = rs.iter().map(|r| r.ops_per_s / 1e6).filter(|v| *v > 0.0).fold(f64::MAX, f64::min) / 2.0;
    let root = SVGBackend::new(&path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let n = workloads.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{key_bytes}-byte keys, batch {batch}: throughput per workload"), ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n as f64, (bottom.max(1e-3)..top.max(1.0)).log_scale())
        .map_err(draw_error)?;
    let labels = workloads.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            labels.get(x.floor() as usize).filter(|_| x.fract() == 0.5).cloned().unwrap_or_default()
        })
        .y_desc("throughput (M operations/s)")
        .draw()
        .map_err(draw_error)?;
    let width = 0.8 / systems.len() as f64;
    for (si, system) in systems.iter().enumerate() {
        let color = COLORS[si % COLORS.len()];
        let bars = workloads.iter().enumerate().filter_map(|(wi, w)| {
            let r = rs.iter().find(|r| &r.system == system && &r.workload == w)?;
            let x0 = wi as f64 + 0.1 + si as f64 * width;
            Some(Rectangle::new([(x0, bottom.max(1e-3)), (x0 + width, r.ops_per_s / 1e6)], color.filled()))
        });
        chart
            .draw_series(bars)
            .map_err(draw_error)?
            .label(system.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw_error)?;
    root.present().map_err(draw_error)?;
    drop(chart);
    drop(root);
    Ok(Some(path))
}
