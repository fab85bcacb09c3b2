//! A [`Timeline`] as one self-contained HTML file: the data as JSON in the page and a
//! small script of our own (`page.js`) that draws it as SVG. No network, no library: the
//! file opens anywhere, offline, as it was written.

use super::Timeline;

const SCRIPT: &str = include_str!("page.js");

const STYLE: &str = r#"
body { font: 13px system-ui, sans-serif; margin: 12px; color: #222; }
h1 { font-size: 17px; margin: 0 0 4px; }
code { background: #f3f3f3; padding: 1px 4px; }
#violations { color: #b00020; margin: 6px 0; }
#violations .passed { color: #1b7a2b; }
#note { color: #7a5a00; }
.legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 12px; height: 10px; margin-right: 4px; vertical-align: middle; }
#chart { overflow-x: auto; border: 1px solid #ddd; }
#details { position: sticky; bottom: 0; background: #fffbe6; border-top: 1px solid #e0c060;
  padding: 6px; min-height: 18px; white-space: pre-wrap; font-family: ui-monospace, monospace; }
svg text { font-size: 11px; }
.axis text { fill: #666; }
.grid { stroke: #eee; }
.lane-bg { fill: #fafafa; stroke: #e4e4e4; }
.lane.operator .lane-bg { fill: #f4f8ff; }
.lane.api .lane-bg { fill: #f7f7f2; }
.lane-name, .row-name { font-weight: 600; fill: #333; }
.row-bg { fill: #fff; stroke: #f0f0f0; }
.fault { fill: rgba(220, 40, 40, 0.16); stroke: rgba(200, 30, 30, 0.6); stroke-dasharray: 3 2; pointer-events: none; }
.fault-bar { fill: rgba(220, 40, 40, 0.55); }
.fault-label { fill: #600; font-weight: 600; }
.span.leader { fill: #2a62c9; }
.span.lease { fill: #8e44ad; }
.span.down { fill: rgba(60, 60, 60, 0.35); }
.span.frozen { fill: rgba(80, 160, 230, 0.35); }
.span.cut { fill: #e67e22; }
.call.answered { fill: #27ae60; }
.call.refused { fill: #f39c12; }
.call.transport { fill: #c0392b; }
.call.abandoned { fill: #6c3483; }
.call.fenced { fill: #7f8c8d; }
.life { stroke: #bbb; stroke-width: 1; }
.state { fill: #ccc; }
.state.s-pending { fill: #f4d03f; }
.state.s-running { fill: #3498db; }
.state.s-completed { fill: #27ae60; }
.state.s-failed, .state.s-nodefail, .state.s-timeout, .state.s-outofmemory, .state.s-lost { fill: #c0392b; }
.state.s-cancelled { fill: #95a5a6; }
.state.s-invalid { fill: #000; }
.created { fill: #fff; stroke: #333; }
.submitted { fill: #333; }
.deadline .bracket { fill: none; stroke-width: 2; }
.deadline.met .bracket, .deadline.met .met-at { stroke: #1b7a2b; stroke-width: 1.5; }
.deadline.missed .bracket, .deadline.missed .overrun { stroke: #d0021b; stroke-width: 3; }
.missed-text { fill: #d0021b; font-weight: 600; paint-order: stroke; stroke: #fff; stroke-width: 3px; }
.violation .cross { stroke: #d0021b; stroke-width: 2.5; }
.clickable { cursor: pointer; }
"#;

const LEGEND: &str = r#"<div class="legend">
<span><i style="background:#27ae60"></i>answered</span>
<span><i style="background:#f39c12"></i>refused</span>
<span><i style="background:#c0392b"></i>transport failure</span>
<span><i style="background:#6c3483"></i>abandoned</span>
<span><i style="background:#7f8c8d"></i>fenced</span>
<span><i style="background:rgba(220,40,40,.4)"></i>fault</span>
<span><i style="background:#2a62c9"></i>controller leader</span>
<span><i style="background:#8e44ad"></i>operator Lease</span>
<span><i style="background:rgba(60,60,60,.35)"></i>down</span>
<span><i style="background:rgba(80,160,230,.35)"></i>frozen</span>
<span><i style="background:#e67e22"></i>cut off</span>
<span><i style="border:2px solid #1b7a2b;height:6px"></i>deadline met</span>
<span><i style="border:2px solid #d0021b;height:6px"></i>deadline missed</span>
</div>
<div class="legend">SpurJob rows:
<span>&#9675; created</span>
<span>&#9670; submitted (its id seen)</span>
<span><i style="background:#f4d03f"></i>Pending</span>
<span><i style="background:#3498db"></i>Running</span>
<span><i style="background:#27ae60"></i>Completed</span>
<span><i style="background:#c0392b"></i>Failed (and other ends in error)</span>
<span><i style="background:#95a5a6"></i>CANCELLED</span>
<span>brackets: below the row for registration and submission, above it for status and deletion</span>
</div>"#;

/// The page. Operator lanes show each call from sent to ended as the operator saw it;
/// replica lanes each answer a replica gave.
pub fn render(timeline: &Timeline) -> String {
    let json = serde_json::to_string(timeline).expect("a timeline serialises");
    // Inside <script>, `</` could end the element early; JSON may escape the slash.
    let json = json.replace("</", "<\\/");
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{STYLE}</style>
</head>
<body>
<h1 id="title"></h1>
<div>replay: <code id="replay"></code></div>
<ul id="violations"></ul>
<div id="note"></div>
{LEGEND}
<div>zoom <input id="zoom" type="range" min="1" max="40" step="1" value="1">
operator lanes: each call from sent to ended, as the operator saw it; replica lanes: each answer a replica gave. Hover for details, click to pin them below.</div>
<div id="chart"></div>
<div id="details">click a mark for its details</div>
<script type="application/json" id="timeline-data">{json}</script>
<script>{SCRIPT}</script>
</body>
</html>
"#,
        title = escape(&timeline.title),
    )
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Writes `timeline` as its HTML page to `path`, saying where on stderr.
pub fn write_page(path: &std::path::Path, timeline: &Timeline) -> std::io::Result<()> {
    let page = render(timeline);
    std::fs::write(path, &page).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("writing the timeline to {}: {e}", path.display()),
        )
    })?;
    eprintln!(
        "timeline: {} ({} KiB; {} calls, {} faults, {} deadlines)",
        path.display(),
        page.len() / 1024,
        timeline.calls.len(),
        timeline.faults.len(),
        timeline.deadlines.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{Timeline, ViolationMark};

    #[test]
    fn the_page_carries_the_data_and_no_premature_script_end() {
        let timeline = Timeline {
            title: "seed 1 <x>".into(),
            violations: vec![ViolationMark {
                check: "status".into(),
                object: "spurjob/a".into(),
                at_ms: 5,
                text: "says </script> here".into(),
            }],
            ..Timeline::default()
        };
        let page = render(&timeline);
        assert!(page.contains("<title>seed 1 &lt;x&gt;</title>"));
        let data_start = page.find(r#"id="timeline-data">"#).expect("data element");
        let data_end = page[data_start..].find("</script>").expect("closed") + data_start;
        let json = &page[data_start + r#"id="timeline-data">"#.len()..data_end];
        let back: serde_json::Value = serde_json::from_str(json).expect("the data is JSON");
        assert_eq!(back["violations"][0]["text"], "says </script> here");
        // Self-contained: nothing is loaded from anywhere.
        assert!(!page.contains(" src=") && !page.contains(" href="));
    }
}
