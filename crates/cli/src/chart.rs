//! Line charts as PNG files (plotters). Text needs a TrueType font: the
//! first of a few common system fonts is used, and without one the chart is
//! drawn with no text rather than not at all.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// Registers a system font for chart text once; false when none was found.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        for path in FONTS {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// One line of a chart.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
}

/// One panel: a title, axis labels and lines.
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// x-axis label.
    pub x_label: String,
    /// y-axis label.
    pub y_label: String,
    /// Lines to draw.
    pub series: Vec<Series>,
    /// Plot y on a log scale.
    pub log_y: bool,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Draws `panels` stacked vertically into a PNG at `path`.
pub fn line_chart(path: &Path, panels: &[Panel]) -> anyhow::Result<()> {
    let text = font_ready();
    let height = 360 * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((panels.len().max(1), 1));
    for (panel, area) in panels.iter().zip(areas) {
        let pts = panel.series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in pts {
            if !x.is_finite() || !y.is_finite() || (panel.log_y && y <= 0.0) {
                continue;
            }
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if x1 - x0 < 1e-12 {
            x1 = x0 + 1.0;
        }
        if y1 - y0 < 1e-12 * y1.abs().max(1.0) {
            let pad = y1.abs().max(1.0) * 0.05;
            (y0, y1) = (y0 - pad, y1 + pad);
        }
        let mut builder = ChartBuilder::on(&area);
        builder.margin(12).x_label_area_size(if text { 36 } else { 4 }).y_label_area_size(if text { 80 } else { 4 });
        if text {
            builder.caption(&panel.title, ("sans-serif", 20));
        }
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                let mut mesh = chart.configure_mesh();
                if text {
                    mesh.x_desc(panel.x_label.as_str()).y_desc(panel.y_label.as_str());
                } else {
                    mesh.disable_x_axis().disable_y_axis();
                }
                mesh.draw()?;
                for (i, s) in panel.series.iter().enumerate() {
                    let c = COLORS[i % COLORS.len()];
                    let keep = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!panel.log_y || y > 0.0);
                    let line =
                        chart.draw_series(LineSeries::new(s.points.iter().copied().filter(keep), c.stroke_width(2)))?;
                    if text {
                        line.label(s.label.clone())
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
                    }
                }
                if text {
                    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
                }
            }};
        }
        if panel.log_y {
            draw!(builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?);
        } else {
            draw!(builder.build_cartesian_2d(x0..x1, y0..y1)?);
        }
    }
    root.present()?;
    Ok(())
}

/// A scalar field on a regular grid, for [`heatmaps`].
pub struct Field {
    /// Panel title.
    pub title: String,
    /// Values, row-major: `ny` rows (y from low to high) of `nx` columns.
    pub values: Vec<f64>,
    /// Columns.
    pub nx: usize,
    /// Rows.
    pub ny: usize,
    /// x range.
    pub x: (f64, f64),
    /// y range.
    pub y: (f64, f64),
    /// Axis labels.
    pub labels: (String, String),
}

/// A perceptual blue-to-yellow colour map (viridis-like), t in [0, 1].
fn colormap(t: f64) -> RGBColor {
    const STOPS: [(f64, f64, f64); 5] =
        [(68.0, 1.0, 84.0), (59.0, 82.0, 139.0), (33.0, 145.0, 140.0), (94.0, 201.0, 98.0), (253.0, 231.0, 37.0)];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 } * (STOPS.len() - 1) as f64;
    let i = (t.floor() as usize).min(STOPS.len() - 2);
    let f = t - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Draws fields side by side as heat maps, each with its value range in the
/// title, into a PNG at `path`.
pub fn heatmaps(path: &Path, fields: &[Field]) -> anyhow::Result<()> {
    let text = font_ready();
    let root = BitMapBackend::new(path, (460 * fields.len().max(1) as u32, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    for (f, area) in fields.iter().zip(root.split_evenly((1, fields.len().max(1)))) {
        let (lo, hi) =
            f.values.iter().filter(|v| v.is_finite()).fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let span = if hi > lo { hi - lo } else { 1.0 };
        let mut b = ChartBuilder::on(&area);
        b.margin(10).x_label_area_size(if text { 30 } else { 2 }).y_label_area_size(if text { 40 } else { 2 });
        if text {
            b.caption(format!("{} [{lo:.2e}, {hi:.2e}]", f.title), ("sans-serif", 16));
        }
        let mut chart = b.build_cartesian_2d(f.x.0..f.x.1, f.y.0..f.y.1)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc(f.labels.0.as_str()).y_desc(f.labels.1.as_str());
        } else {
            mesh.disable_x_axis().disable_y_axis();
        }
        mesh.disable_mesh().draw()?;
        let (dx, dy) = ((f.x.1 - f.x.0) / f.nx as f64, (f.y.1 - f.y.0) / f.ny as f64);
        chart.draw_series((0..f.ny).flat_map(|j| (0..f.nx).map(move |i| (i, j))).map(|(i, j)| {
            let v = f.values[j * f.nx + i];
            let (x0, y0) = (f.x.0 + i as f64 * dx, f.y.0 + j as f64 * dy);
            Rectangle::new([(x0, y0), (x0 + dx, y0 + dy)], colormap((v - lo) / span).filled())
        }))?;
    }
    root.present()?;
    Ok(())
}
