//! The compaction evaluation, as CI runs it: one scenario, summarized by the
//! real local model (SmolLM2), must keep every fact keel keeps by
//! construction (the person's messages, the files written) and reclaim most
//! of the context. How many decisions the summary keeps is reported by
//! `keel-bench compaction`, not asserted: it measures the model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

#[test]
fn one_scenario_keeps_every_fact_keel_promises_and_reclaims_most_tokens() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let fetched = Command::new("bash").arg(repo.join("scripts/fetch-model")).output().unwrap();
    assert!(fetched.status.success(), "{}", String::from_utf8_lossy(&fetched.stderr));
    let model = String::from_utf8_lossy(&fetched.stdout).trim().to_string();
    let models_dir = Path::new(&model).parent().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel-bench"))
        .args(["compaction", "--scenarios", "1", "--strict"])
        .env("KEEL_MODELS_DIR", models_dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["facts_kept"]["person"], "3/3", "{report:#}");
    assert_eq!(report["facts_kept"]["files"], "2/2", "{report:#}");
    let scenario = &report["scenarios"][0];
    assert!(scenario["reclaimed_percent"].as_f64().unwrap() > 50.0, "{report:#}");
    assert!(scenario["summary_output_tokens"].as_u64().unwrap() > 0, "a real summary was written");
}
