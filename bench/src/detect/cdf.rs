//! The latency CDF plot of `vigil-bench detect` (`results/detect-cdf.png`), drawn with `plotters`.
//!
//! Text is rendered with `ab_glyph` from a TrueType font read at run time (Debian's `fonts-dejavu-core`,
//! `/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf`, or `VIGIL_BENCH_FONT`), so nothing links against
//! fontconfig or freetype.

use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;

/// One curve: an empirical CDF of `samples_ms`.
pub(super) struct Curve {
    /// Legend text.
    pub(super) label: String,
    /// Latencies, milliseconds.
    pub(super) samples_ms: Vec<f64>,
    /// Index of the measurement (chooses the colour).
    pub(super) color: usize,
    /// Drawn dashed (the userspace fallback) rather than solid (eBPF).
    pub(super) dashed: bool,
    /// Drawn thin and grey-ish dotted: a reference, not a Vigil measurement.
    pub(super) reference: bool,
}

/// Fonts tried in order when `VIGIL_BENCH_FONT` is not set.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Colours of the measurements, in order (readable on white, distinct for the colour-blind where possible).
const COLORS: &[RGBColor] = &[
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];

/// Register a TrueType font as `sans-serif` (once per process).
fn register_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let candidates: Vec<String> = match std::env::var("VIGIL_BENCH_FONT") {
            Ok(f) => vec![f],
            Err(_) => FONTS.iter().map(|s| s.to_string()).collect(),
        };
        for f in &candidates {
            if let Ok(bytes) = std::fs::read(f) {
                // Fonts are registered for the whole process: leaking one font file once is intended.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                    .map_err(|_| format!("{f}: not a usable TrueType font"));
            }
        }
        Err(format!(
            "no TrueType font found (tried {}); install fonts-dejavu-core or set VIGIL_BENCH_FONT",
            candidates.join(", ")
        ))
    })
    .clone()
}

/// Step points of the empirical CDF of `v` (sorted): (x_i, i/n) → (x_i, (i+1)/n).
fn cdf_points(v: &[f64]) -> Vec<(f64, f64)> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    let mut pts = Vec::with_capacity(2 * s.len());
    for (i, x) in s.iter().enumerate() {
        pts.push((*x, i as f64 / n));
        pts.push((*x, (i + 1) as f64 / n));
    }
    pts
}

/// Decade bounds around every sample: (10^floor(log10 min), 10^ceil(log10 max)).
fn x_range(curves: &[Curve]) -> (f64, f64) {
    let all = curves.iter().flat_map(|c| c.samples_ms.iter().copied()).filter(|x| x.is_finite() && *x > 0.0);
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if !lo.is_finite() {
        return (0.1, 1000.0);
    }
    let lo = 10f64.powf(lo.log10().floor());
    let mut hi = 10f64.powf(hi.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    (lo, hi)
}

/// A tick label for milliseconds on a log axis: 0.01, 0.1, 1, 10, 100, 1000, ...
fn ms_label(x: &f64) -> String {
    if *x >= 1.0 {
        format!("{x:.0}")
    } else {
        let digits = (-x.log10()).ceil().max(1.0) as usize;
        format!("{x:.digits$}")
    }
}

/// Draw the CDFs of `curves` into a PNG at `path`.
pub(super) fn plot(path: &Path, title: &str, curves: &[Curve]) -> Result<(), String> {
    register_font()?;
    let e = |e: &dyn std::fmt::Debug| format!("plotting {}: {e:?}", path.display());
    let root = BitMapBackend::new(path, (2000, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    // The chart on the left, the legend beside it (so it never hides a curve).
    let (left, right) = root.split_horizontally(1200);
    let (lo, hi) = x_range(curves);
    let mut chart = ChartBuilder::on(&left)
        .caption(title, ("sans-serif", 26))
        .margin(24)
        .x_label_area_size(60)
        .y_label_area_size(80)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0f64..1.0)
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("latency from failure to verdict (ms, log scale)")
        .y_desc("fraction of trials")
        .x_label_formatter(&ms_label)
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style(("sans-serif", 20))
        .axis_desc_style(("sans-serif", 22))
        .draw()
        .map_err(|x| e(&x))?;
    let mut y = 60;
    for c in curves {
        let pts = cdf_points(&c.samples_ms);
        if pts.is_empty() {
            continue;
        }
        let color = COLORS[c.color % COLORS.len()];
        let width = if c.reference { 2 } else { 3 };
        let style = ShapeStyle { color: color.to_rgba(), filled: false, stroke_width: width };
        if c.reference {
            chart.draw_series(DashedLineSeries::new(pts, 2, 5, style)).map_err(|x| e(&x))?;
        } else if c.dashed {
            chart.draw_series(DashedLineSeries::new(pts, 10, 6, style)).map_err(|x| e(&x))?;
        } else {
            chart.draw_series(LineSeries::new(pts, style)).map_err(|x| e(&x))?;
        }
        // The legend entry: a sample of the line (solid, dashed or dotted) and the label.
        let segs: &[(i32, i32)] = if c.reference {
            &[(0, 3), (9, 12), (18, 21), (27, 30), (36, 39)]
        } else if c.dashed {
            &[(0, 10), (15, 25), (30, 40)]
        } else {
            &[(0, 40)]
        };
        for (a, b) in segs {
            right.draw(&PathElement::new(vec![(10 + a, y), (10 + b, y)], style)).map_err(|x| e(&x))?;
        }
        right
            .draw(&Text::new(c.label.clone(), (60, y - 10), ("sans-serif", 18).into_font().color(&BLACK)))
            .map_err(|x| e(&x))?;
        y += 30;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_steps_reach_one() {
        let p = cdf_points(&[3.0, 1.0, 2.0]);
        assert_eq!(p.first(), Some(&(1.0, 0.0)));
        assert_eq!(p.last(), Some(&(3.0, 1.0)));
        assert_eq!(p.len(), 6);
    }

    #[test]
    fn x_range_spans_decades() {
        let c = Curve { label: String::new(), samples_ms: vec![0.35, 42.0], color: 0, dashed: false, reference: false };
        let (lo, hi) = x_range(&[c]);
        assert!((lo - 0.1).abs() < 1e-12 && (hi - 100.0).abs() < 1e-9, "{lo} {hi}");
        assert_eq!(x_range(&[]), (0.1, 1000.0));
    }

    #[test]
    fn ms_labels() {
        assert_eq!(ms_label(&100.0), "100");
        assert_eq!(ms_label(&0.1), "0.1");
        assert_eq!(ms_label(&0.01), "0.01");
    }
}
