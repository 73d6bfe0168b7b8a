//! SVG charts of results, written by hand: a few line charts do not need a plotting
//! library's font stack.
//!
//! - One run: latency percentiles (p50, p90, p99) of TTFT and E2EL, TPOT and ITL.
//! - A sweep (or several, e.g. two engines): output throughput against TTFT and TPOT,
//!   one line per engine, each point labelled with its concurrency or rate.

use std::fmt::Write;

use serde_json::Value;

const W: f64 = 460.0;
const H: f64 = 320.0;
const PAD_L: f64 = 62.0;
const PAD_R: f64 = 16.0;
const PAD_T: f64 = 34.0;
const PAD_B: f64 = 46.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

#[derive(Clone)]
pub struct Series {
    pub name: String,
    /// (x, y, point label)
    pub points: Vec<(f64, f64, String)>,
    pub dashed: bool,
    /// Index into the palette: series of one engine share it.
    pub color: usize,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// A round step giving about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    mag * if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}").trim_end_matches('0').to_string()
    }
}

impl Chart {
    fn draw(&self, o: &mut String, ox: f64, oy: f64) {
        let pts = self.series.iter().flat_map(|s| &s.points);
        // 8% headroom so the outermost points' labels stay inside the plot.
        let xmax = pts.clone().map(|p| p.0).fold(0.0, f64::max) * 1.08;
        let ymax = pts.map(|p| p.1).fold(0.0, f64::max) * 1.08;
        let (xs, ys) = (
            nice_step(xmax.max(1e-9), 5.0),
            nice_step(ymax.max(1e-9), 5.0),
        );
        let (xmax, ymax) = (
            (xmax / xs).ceil().max(1.0) * xs,
            (ymax / ys).ceil().max(1.0) * ys,
        );
        let (pw, ph) = (W - PAD_L - PAD_R, H - PAD_T - PAD_B);
        let px = |x: f64| ox + PAD_L + x / xmax * pw;
        let py = |y: f64| oy + PAD_T + ph - y / ymax * ph;
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" font-size="14" font-weight="bold" text-anchor="middle">{}</text>"#,
            ox + W / 2.0,
            oy + 20.0,
            esc(&self.title)
        );
        // Grid and ticks.
        let mut v = 0.0;
        while v <= ymax + ys / 2.0 {
            let y = py(v);
            let _ = writeln!(
                o,
                r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/>"##,
                px(0.0),
                px(xmax)
            );
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{}</text>"#,
                px(0.0) - 5.0,
                y + 4.0,
                fmt_tick(v)
            );
            v += ys;
        }
        let mut v = 0.0;
        while v <= xmax + xs / 2.0 {
            let x = px(v);
            let _ = writeln!(
                o,
                r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#eee"/>"##,
                py(0.0),
                py(ymax)
            );
            let _ = writeln!(
                o,
                r#"<text x="{x}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
                py(0.0) + 15.0,
                fmt_tick(v)
            );
            v += xs;
        }
        let _ = writeln!(
            o,
            r#"<rect x="{}" y="{}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#,
            px(0.0),
            py(ymax)
        );
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>"#,
            px(xmax / 2.0),
            oy + H - 8.0,
            esc(&self.x_label)
        );
        let (lx, ly) = (ox + 14.0, oy + PAD_T + ph / 2.0);
        let _ = writeln!(
            o,
            r#"<text x="{lx}" y="{ly}" font-size="12" text-anchor="middle" transform="rotate(-90 {lx} {ly})">{}</text>"#,
            esc(&self.y_label)
        );
        // Lines, points, point labels, legend.
        for (i, s) in self.series.iter().enumerate() {
            let c = COLORS[s.color % COLORS.len()];
            let path: Vec<String> = s
                .points
                .iter()
                .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
                .collect();
            let dash = if s.dashed {
                r#" stroke-dasharray="5,3""#
            } else {
                ""
            };
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"{dash}/>"#,
                path.join(" ")
            );
            for p in &s.points {
                let _ = writeln!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                    px(p.0),
                    py(p.1)
                );
                if !p.2.is_empty() {
                    let _ = writeln!(
                        o,
                        r#"<text x="{:.1}" y="{:.1}" font-size="10" fill="{c}">{}</text>"#,
                        px(p.0) + 4.0,
                        py(p.1) - 4.0,
                        esc(&p.2)
                    );
                }
            }
            let (lx, ly) = (px(0.0) + 8.0, py(ymax) + 14.0 + 14.0 * i as f64);
            let _ = writeln!(
                o,
                r#"<line x1="{lx}" y1="{}" x2="{}" y2="{}" stroke="{c}" stroke-width="2"{dash}/>"#,
                ly - 4.0,
                lx + 18.0,
                ly - 4.0
            );
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{ly}" font-size="11">{}</text>"#,
                lx + 22.0,
                esc(&s.name)
            );
        }
    }
}

/// Charts side by side in one SVG document.
pub fn svg(title: &str, charts: &[Chart]) -> String {
    let top = 28.0;
    let width = W * charts.len().max(1) as f64;
    let mut o = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{}" font-family="sans-serif">"#,
        H + top
    );
    o.push('\n');
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="20" font-size="15" text-anchor="middle">{}</text>"#,
        width / 2.0,
        esc(title)
    );
    for (i, c) in charts.iter().enumerate() {
        c.draw(&mut o, W * i as f64, top);
    }
    o.push_str("</svg>\n");
    o
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// One run (a summary as JSON): latency percentiles.
pub fn run_chart(s: &Value) -> String {
    let pct = |name: &str| -> Vec<(f64, f64, String)> {
        [("median", 50.0), ("p90", 90.0), ("p99", 99.0)]
            .iter()
            .map(|(k, p)| (*p, f(s, &format!("{k}_{name}_ms")), String::new()))
            .collect()
    };
    let series = |names: &[&str]| -> Vec<Series> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| Series {
                name: n.to_uppercase(),
                points: pct(n),
                dashed: false,
                color: i,
            })
            .collect()
    };
    let title = format!(
        "{} {}: {:.1} output tok/s, {} completed, {} failed",
        s["label"].as_str().unwrap_or(""),
        s["model_id"].as_str().unwrap_or(""),
        f(s, "output_throughput"),
        s["completed"],
        s["failed"],
    );
    svg(
        title.trim(),
        &[
            Chart {
                title: "TTFT and end-to-end latency".into(),
                x_label: "percentile".into(),
                y_label: "ms".into(),
                series: series(&["ttft", "e2el"]),
            },
            Chart {
                title: "Per-token latency".into(),
                x_label: "percentile".into(),
                y_label: "ms".into(),
                series: series(&["tpot", "itl"]),
            },
        ],
    )
}

/// Sweeps (each a list of run summaries as JSON, under a label): output throughput
/// against TTFT and TPOT.
pub fn sweep_chart(title: &str, sweeps: &[(String, Vec<Value>)]) -> String {
    let point_label = |r: &Value| match r["max_concurrency"].as_u64() {
        Some(c) => format!("c={c}"),
        None => format!("{}/s", r["request_rate"].as_str().unwrap_or("?")),
    };
    let lines = |stat: &str, metric: &str, dashed: bool| -> Vec<Series> {
        sweeps
            .iter()
            .enumerate()
            .map(|(i, (label, runs))| Series {
                name: format!("{label} {}", if stat == "median" { "p50" } else { stat }),
                points: runs
                    .iter()
                    .map(|r| {
                        (
                            f(r, "output_throughput"),
                            f(r, &format!("{stat}_{metric}_ms")),
                            if dashed {
                                String::new()
                            } else {
                                point_label(r)
                            },
                        )
                    })
                    .collect(),
                dashed,
                color: i,
            })
            .collect()
    };
    let chart = |metric: &str, name: &str| Chart {
        title: format!("{name} against throughput"),
        x_label: "output tokens/s".into(),
        y_label: format!("{name} (ms)"),
        series: [lines("median", metric, false), lines("p99", metric, true)].concat(),
    };
    svg(title, &[chart("ttft", "TTFT"), chart("tpot", "TPOT")])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn charts_are_well_formed_svg_with_every_series() {
        let run = |c: u64, t: f64| {
            json!({"max_concurrency": c, "output_throughput": t, "median_ttft_ms": 10.0 * c as f64,
                   "p99_ttft_ms": 20.0 * c as f64, "median_tpot_ms": 15.0, "p99_tpot_ms": 30.0})
        };
        let s = sweep_chart(
            "a <b> & c",
            &[
                ("pagellm".into(), vec![run(1, 40.0), run(4, 90.0)]),
                ("other".into(), vec![run(1, 30.0)]),
            ],
        );
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains("a &lt;b&gt; &amp; c"));
        assert!(s.contains(">pagellm p50<") && s.contains(">other p99<") && s.contains(">c=4<"));
        assert_eq!(s.matches("<polyline").count(), 8);
        // One colour per engine: its p50 and p99 lines in both charts.
        for c in &COLORS[..2] {
            assert_eq!(
                s.matches(&format!(r#"fill="none" stroke="{c}""#)).count(),
                4
            );
        }
        assert!(!s.contains("NaN") && !s.contains("inf"));
        let r = run_chart(&json!({"label": "x", "median_ttft_ms": 5.0, "p99_e2el_ms": 900.0}));
        assert_eq!(r.matches("<polyline").count(), 4);
        assert!(!r.contains("NaN"));
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_step(97.0, 5.0), 20.0);
        assert_eq!(nice_step(0.9, 5.0), 0.2);
        assert_eq!(fmt_tick(0.2), "0.2");
        assert_eq!(fmt_tick(1200.0), "1200");
    }
}
