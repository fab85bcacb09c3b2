//! Lag distributions as an SVG picture: one panel a metric, one cumulative curve a series
//! (a profile of `spur-sim compare`, or the lab beside its simulated twins), on a log time
//! axis, with the metric's deadline as a line. Written by hand: a few hundred bytes of
//! paths, where a plotting crate would bring a font stack and an image encoder for it.

use std::fmt::Write as _;
use std::time::Duration;

/// One metric's panel.
pub struct Panel<'a> {
    pub title: &'a str,
    pub deadline: Option<Duration>,
}

/// One curve a panel: its name and, per panel, its samples in milliseconds.
pub struct Series<'a> {
    pub name: &'a str,
    pub samples: Vec<Vec<u64>>,
}

const COLOURS: [&str; 6] = [
    "#2a62c9", "#d35400", "#27ae60", "#8e44ad", "#c0392b", "#7f8c8d",
];
const PANEL_W: f64 = 470.0;
const PANEL_H: f64 = 300.0;
const MARGIN_L: f64 = 52.0;
const MARGIN_R: f64 = 16.0;
const MARGIN_T: f64 = 30.0;
const MARGIN_B: f64 = 40.0;
/// The log axis starts here: a lag below it (the operator within one 250 ms sample) is
/// drawn at it.
const MIN_MS: f64 = 100.0;

/// The picture: panels two a row, each with every series' cumulative distribution.
pub fn cdf_svg(title: &str, panels: &[Panel<'_>], series: &[Series<'_>]) -> String {
    let columns = 2usize;
    let rows = panels.len().div_ceil(columns);
    let legend_h = 26.0;
    let width = PANEL_W * columns as f64;
    let height = 34.0 + legend_h + PANEL_H * rows as f64;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        svg,
        r#"<rect width="{width}" height="{height}" fill="white"/><text x="10" y="20" font-size="15" font-weight="bold">{}</text>"#,
        escape(title)
    );
    for (i, s) in series.iter().enumerate() {
        let x = 10.0 + 150.0 * i as f64;
        let colour = COLOURS[i % COLOURS.len()];
        let _ = write!(
            svg,
            r#"<g class="legend"><line x1="{x}" x2="{}" y1="42" y2="42" stroke="{colour}" stroke-width="3"/><text x="{}" y="46">{}</text></g>"#,
            x + 22.0,
            x + 28.0,
            escape(s.name)
        );
    }
    let max_ms = series
        .iter()
        .flat_map(|s| s.samples.iter().flatten())
        .copied()
        .chain(
            panels
                .iter()
                .filter_map(|p| p.deadline.map(|d| d.as_millis() as u64)),
        )
        .max()
        .unwrap_or(1000)
        .max(1000) as f64;
    let max_ms = 10f64.powf(max_ms.log10().ceil());
    for (p, panel) in panels.iter().enumerate() {
        let left = PANEL_W * (p % columns) as f64;
        let top = 34.0 + legend_h + PANEL_H * (p / columns) as f64;
        draw_panel(&mut svg, panel, p, series, (left, top), max_ms);
    }
    svg.push_str("</svg>\n");
    svg
}

fn draw_panel(
    svg: &mut String,
    panel: &Panel<'_>,
    index: usize,
    series: &[Series<'_>],
    (left, top): (f64, f64),
    max_ms: f64,
) {
    let frame = Frame {
        left,
        x0: left + MARGIN_L,
        x1: left + PANEL_W - MARGIN_R,
        y0: top + PANEL_H - MARGIN_B,
        y1: top + MARGIN_T,
        max_ms,
    };
    let _ = write!(
        svg,
        r#"<g class="panel" data-metric="{}"><text x="{}" y="{}" font-size="13" font-weight="bold">{}</text>"#,
        escape(panel.title),
        frame.x0,
        top + 18.0,
        escape(panel.title)
    );
    frame.draw_axes(svg);
    if let Some(deadline) = panel.deadline {
        frame.draw_deadline(svg, deadline);
    }
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut samples = s.samples.get(index).cloned().unwrap_or_default();
        samples.sort_unstable();
        let n = samples.len();
        let d = frame.cdf_path(&samples);
        let _ = write!(
            svg,
            r#"<path class="cdf" data-series="{}" data-samples="{n}" d="{d}" fill="none" stroke="{colour}" stroke-width="2"><title>{} ({n} samples)</title></path>"#,
            escape(s.name),
            escape(s.name)
        );
    }
    svg.push_str("</g>");
}

/// Where one panel's plot area sits, and how a lag and a fraction map into it.
struct Frame {
    /// The panel's left edge.
    left: f64,
    /// The plot area: the time axis from `x0` to `x1`, the fraction axis from `y0`
    /// (none) up to `y1` (all).
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    /// The longest lag on the axis, in milliseconds (a power of ten).
    max_ms: f64,
}

impl Frame {
    /// Where lag `ms` sits on the log time axis (below [`MIN_MS`] at it).
    fn x(&self, ms: f64) -> f64 {
        let t = (ms.max(MIN_MS).log10() - MIN_MS.log10()) / (self.max_ms.log10() - MIN_MS.log10());
        self.x0 + t * (self.x1 - self.x0)
    }

    /// Where `fraction` of the samples sits on the vertical axis.
    fn y(&self, fraction: f64) -> f64 {
        self.y0 - fraction * (self.y0 - self.y1)
    }

    /// The frame, the grid (decades on the time axis, quarters on the fraction axis) and
    /// the axes' labels.
    fn draw_axes(&self, svg: &mut String) {
        let Frame { x0, x1, y0, y1, .. } = *self;
        let _ = write!(
            svg,
            r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
            x1 - x0,
            y0 - y1
        );
        let mut tick = MIN_MS;
        while tick <= self.max_ms * 1.0001 {
            let tx = self.x(tick);
            let label = if tick < 1000.0 {
                format!("{} s", tick / 1000.0)
            } else {
                format!("{} s", (tick / 1000.0) as u64)
            };
            let _ = write!(
                svg,
                r##"<line x1="{tx}" x2="{tx}" y1="{y1}" y2="{y0}" stroke="#eee"/><text x="{tx}" y="{}" text-anchor="middle">{label}</text>"##,
                y0 + 14.0
            );
            tick *= 10.0;
        }
        for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let ty = self.y(q);
            let _ = write!(
                svg,
                r##"<line x1="{x0}" x2="{x1}" y1="{ty}" y2="{ty}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{q}</text>"##,
                x0 - 4.0,
                ty + 4.0
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">lag (log scale; below 0.1 s drawn at 0.1 s)</text><text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">fraction within</text>"#,
            (x0 + x1) / 2.0,
            y0 + 30.0,
            self.left + 14.0,
            (y0 + y1) / 2.0,
            self.left + 14.0,
            (y0 + y1) / 2.0
        );
    }

    /// The metric's deadline as a dashed red line, labelled.
    fn draw_deadline(&self, svg: &mut String, deadline: Duration) {
        let (y0, y1) = (self.y0, self.y1);
        let dx = self.x(deadline.as_millis() as f64);
        let _ = write!(
            svg,
            r##"<line class="deadline" x1="{dx}" x2="{dx}" y1="{y1}" y2="{y0}" stroke="#d0021b" stroke-dasharray="5 3" stroke-width="1.5"/><text x="{}" y="{}" fill="#d0021b">deadline {} s</text>"##,
            dx + 3.0,
            y1 + 12.0,
            deadline.as_secs()
        );
    }

    /// The path data of the cumulative curve of `sorted` (empty without samples): a step
    /// function, flat at each fraction until the next distinct value, where it rises by
    /// that value's share (one step a value keeps the file small: lags are multiples of
    /// the 250 ms sample).
    fn cdf_path(&self, sorted: &[u64]) -> String {
        let mut d = String::new();
        let n = sorted.len();
        if n == 0 {
            return d;
        }
        let _ = write!(d, "M{:.1} {:.1}", self.x(sorted[0] as f64), self.y(0.0));
        let mut below = 0;
        for (value, count) in distinct_counts(sorted) {
            let sx = self.x(value as f64);
            let _ = write!(
                d,
                " L{sx:.1} {:.1} L{sx:.1} {:.1}",
                self.y(below as f64 / n as f64),
                self.y((below + count) as f64 / n as f64)
            );
            below += count;
        }
        let _ = write!(d, " L{:.1} {:.1}", self.x1, self.y(1.0));
        d
    }
}

/// Each distinct value of `sorted` with how often it occurs, in order.
fn distinct_counts(sorted: &[u64]) -> Vec<(u64, usize)> {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    for value in sorted {
        match counts.last_mut() {
            Some((last, count)) if last == value => *count += 1,
            _ => counts.push((*value, 1)),
        }
    }
    counts
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_curve_per_series_in_every_panel_and_the_deadline_drawn() {
        let panels = [
            Panel {
                title: "registration",
                deadline: Some(Duration::from_secs(15)),
            },
            Panel {
                title: "status",
                deadline: None,
            },
        ];
        let series = [
            Series {
                name: "default",
                samples: vec![vec![250, 750, 500, 500], vec![]],
            },
            Series {
                name: "seed-fix <old>",
                samples: vec![vec![9000], vec![2000, 0]],
            },
        ];
        let svg = cdf_svg("lags", &panels, &series);
        assert_eq!(svg.matches(r#"<g class="panel""#).count(), 2);
        assert_eq!(svg.matches(r#"class="cdf""#).count(), 4);
        assert_eq!(svg.matches(r#"class="deadline""#).count(), 1);
        assert!(svg.contains(r#"data-series="seed-fix &lt;old&gt;" data-samples="2""#));
        // The curve of four samples of three values climbs in three steps to the top.
        let path = svg
            .split(r#"data-series="default" data-samples="4" d=""#)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("the default curve");
        assert_eq!(path.matches(" L").count(), 3 * 2 + 1);
        assert_eq!(
            distinct_counts(&[1, 1, 2, 5, 5, 5]),
            [(1, 2), (2, 1), (5, 3)]
        );
        assert!(svg.ends_with("</svg>\n"));
    }
}
