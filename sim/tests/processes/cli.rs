//! `spur-sim`'s command line end to end: shards run apart and merged give the summary of
//! one run over every seed, and the exit status says whether scenarios failed.

use std::process::Command;

use serde_json::Value;

fn spur_sim(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spur-sim"))
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stdout).unwrap())
}

/// The summary line of `run --json` or `merge --json`, without its wall time.
fn summary(output: &str) -> Value {
    let line = output
        .lines()
        .find(|l| l.starts_with("{\"summary\""))
        .unwrap_or_else(|| panic!("no summary in {output}"));
    let mut value: Value = serde_json::from_str(line).unwrap();
    value["summary"].as_object_mut().unwrap().remove("wall_ms");
    value
}

#[test]
fn merged_shards_summarise_exactly_like_one_run() {
    let dir = std::env::temp_dir().join(format!("spur-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut shards = Vec::new();
    for i in 0..2 {
        let shard = format!("--shard={i}/2");
        let (code, out) = spur_sim(&["run", "--seeds=0..4", &shard, "--json", "--jobs=1"]);
        assert_eq!(code, Some(0), "{out}");
        // One line a scenario of this shard, then the summary; seeds in sim.md's format.
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(lines[0]["seed"], i);
        assert!(lines[0]["trace_hash"].is_string() && lines[0]["metrics"]["rpcs"].is_u64());
        let path = dir.join(format!("shard-{i}.json"));
        std::fs::write(&path, &out).unwrap();
        shards.push(path.to_str().unwrap().to_owned());
    }
    let (code, whole) = spur_sim(&["run", "--seeds=0..4", "--json", "--jobs=1"]);
    assert_eq!(code, Some(0), "{whole}");
    let mut args = vec!["merge", "--json", "--seeds=0..4"];
    args.extend(shards.iter().map(String::as_str));
    let (code, merged) = spur_sim(&args);
    assert_eq!(code, Some(0), "{merged}");
    assert_eq!(summary(&merged), summary(&whole));
    assert_eq!(summary(&merged)["summary"]["scenarios"], 4);

    // A missing shard is an error (exit 2) that says so, not a smaller sweep.
    let (code, _) = spur_sim(&["merge", "--seeds=0..4", &shards[0]]);
    assert_eq!(code, Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A denser run draws more faults than the default on the same seed and replays with the
/// same flags, the step included; a knob out of range is refused with a message that
/// names it.
#[test]
fn fault_density_duration_and_tick_press_harder_and_replay_with_the_same_flags() {
    let faults = |out: &str| -> usize {
        let line: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        line["faults"].as_array().map_or(0, Vec::len)
    };
    let (code, plain) = spur_sim(&["run", "--seeds=3..4", "--json", "--jobs=1"]);
    assert_eq!(code, Some(0), "{plain}");
    let dense_args = [
        "run",
        "--seeds=3..4",
        "--json",
        "--jobs=1",
        "--fault-density=5",
        "--duration=240s",
        "--tick=10ms",
    ];
    let (_, dense) = spur_sim(&dense_args);
    assert!(faults(&dense) > faults(&plain), "{plain}\n{dense}");
    let line: Value = serde_json::from_str(dense.lines().next().unwrap()).unwrap();
    let replay = line["replay"].as_str().unwrap();
    assert!(
        replay.contains("--fault-density 5 --duration 4m --tick 10ms --service "),
        "{replay}"
    );

    for bad in [
        "--fault-density=0",
        "--duration=5s",
        "--duration=soon",
        "--tick=0ms",
        "--tick=1s",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_spur-sim"))
            .args(["run", "--seeds=0..1", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let flag = bad.split('=').next().unwrap();
        assert!(stderr.contains(flag), "{bad}: {stderr}");
    }
}
