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
