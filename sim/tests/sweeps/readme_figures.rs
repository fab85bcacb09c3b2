//! The README's and docs/evidence.md's simulated figures, held: each is what its command
//! prints at this commit. The simulation is deterministic, so a figure that drifted is a
//! change of behaviour the text has not caught up with; each failure names the command
//! that rewrites it, or the page to update.

use spur_judge::profiles::Profile;
use spur_sim::cli::{compare_plot, compare_runs, compare_table_seeds, splice_compare_table};

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

const README: &str = include_str!("../../../README.md");

/// The page of measured figures, which holds the bench-nodes one.
const EVIDENCE: &str = include_str!("../../../docs/evidence.md");

/// The picture of the same seeds beside the table (`docs/compare-lags.svg`).
const PLOT: &str = include_str!("../../../docs/compare-lags.svg");

#[test]
fn the_readme_compare_table_and_plot_are_what_compare_prints() {
    let range = compare_table_seeds(README)
        .expect("README.md has the compare-table markers, the opening one naming --seeds");
    let seeds: Vec<u64> = range.clone().collect();
    let (table, _, records) = compare_runs(&seeds, &Profile::ALL, threads());
    let expected = splice_compare_table(README, &range, &table).expect("markers");
    let command = format!(
        "cargo run --release -p spur-sim -- compare --seeds {}..{} --readme README.md --plot docs/compare-lags.svg",
        range.start, range.end
    );
    assert!(
        README == expected,
        "README.md's compare table is stale: run `{command}`; the table now:\n{table}"
    );
    assert!(
        PLOT == compare_plot(&range, &Profile::ALL, &records),
        "docs/compare-lags.svg is stale: run `{command}`"
    );
}

#[test]
fn the_compare_table_splices_between_its_markers_only() {
    let text = "before\n<!-- compare-table:begin (old) -->\n```\nold\n```\n<!-- compare-table:end -->\nafter\n";
    let spliced = splice_compare_table(text, &(3..5), "new\n").unwrap();
    assert_eq!(
        spliced,
        "before\n<!-- compare-table:begin (spur-sim compare --seeds 3..5 --readme README.md) -->\n```\nnew\n```\n<!-- compare-table:end -->\nafter\n"
    );
    assert_eq!(compare_table_seeds(&spliced), Some(3..5));
    assert_eq!(splice_compare_table("no markers", &(0..1), "x"), None);
}

/// The number after `before` in docs/evidence.md, up to its unit.
fn figure(before: &str) -> f64 {
    let after = EVIDENCE
        .split(before)
        .nth(1)
        .unwrap_or_else(|| panic!("docs/evidence.md has no {before:?}"));
    let number: String = after
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number
        .parse()
        .unwrap_or_else(|_| panic!("no number after {before:?} in docs/evidence.md"))
}

#[test]
fn the_evidence_bench_nodes_figure_is_what_bench_nodes_measures() {
    let load = spur_sim::cli::measure_nodes(5000, 10).unwrap();
    let said = figure("bench-nodes --nodes 5000 --rtt-ms 10` registers 5,000 nodes in ");
    let measured = load.registered_after.as_secs_f64();
    assert!(
        (said - measured).abs() < 0.005,
        "docs/evidence.md says {said} s, `spur-sim bench-nodes --nodes 5000 --rtt-ms 10` \
         measures {measured:.2} s: update docs/evidence.md ({load:?})"
    );
    let leader_registrations = load.per_replica.get(&load.leader).map_or(0, |r| r.0);
    let said = figure("registrations answered by the leader: ");
    assert_eq!(said as usize, leader_registrations, "{load:?}");
}
