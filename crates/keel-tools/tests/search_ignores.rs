//! `fs.glob` and `fs.grep` honour `.gitignore` and `.ignore` files inside
//! the workspace, skip `node_modules`, and still search what the model names
//! explicitly. The workspace here is not a git repository: its `.gitignore`
//! counts anyway. Every ignored file below was listed by the former walker.

use keel_tools::search::{Glob, Grep};
use keel_tools::{Tool, ToolContext, ToolOutput};
use serde_json::json;

fn workspace() -> (tempfile::TempDir, ToolContext) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let files = [
        (".gitignore", "build/\n*.log\n"),
        (".ignore", "vendor/\n"),
        (".github/ci.yml", "needle\n"),
        ("build/out.txt", "needle\n"),
        ("debug.log", "needle\n"),
        ("node_modules/pkg/index.js", "needle\n"),
        ("src/main.rs", "needle\n"),
        ("src/trace.log", "needle\n"),
        ("src/gen/.gitignore", "*.generated.rs\n"),
        ("src/gen/a.generated.rs", "needle\n"),
        ("src/gen/keep.rs", "needle\n"),
        ("vendor/lib.rs", "needle\n"),
    ];
    for (path, text) in files {
        let path = dir.path().join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
    }
    let context = ToolContext::new("s", dir.path());
    (dir, context)
}

#[tokio::test]
async fn glob_leaves_out_ignored_files_and_node_modules() {
    let (_dir, ctx) = workspace();
    assert_eq!(
        Glob.call(&ctx, json!({"pattern": "**"})).await,
        ToolOutput::ok(".github/ci.yml\n.gitignore\n.ignore\nsrc/gen/.gitignore\nsrc/gen/keep.rs\nsrc/main.rs")
    );
    assert_eq!(Glob.call(&ctx, json!({"pattern": "**/*.log"})).await, ToolOutput::ok("no paths"));
    assert_eq!(
        Glob.call(&ctx, json!({"pattern": "src/**/*.rs"})).await,
        ToolOutput::ok("src/gen/keep.rs\nsrc/main.rs")
    );
}

#[tokio::test]
async fn grep_leaves_out_ignored_files_and_node_modules() {
    let (_dir, ctx) = workspace();
    assert_eq!(
        Grep.call(&ctx, json!({"pattern": "needle"})).await,
        ToolOutput::ok(".github/ci.yml:1: needle\nsrc/gen/keep.rs:1: needle\nsrc/main.rs:1: needle")
    );
    // Rules of the folders above the one searched apply too: *.log is the
    // root's rule, *.generated.rs the nested folder's.
    assert_eq!(
        Grep.call(&ctx, json!({"pattern": "needle", "path": "src"})).await,
        ToolOutput::ok("src/gen/keep.rs:1: needle\nsrc/main.rs:1: needle")
    );
}

#[tokio::test]
async fn what_the_model_names_is_searched_even_if_ignored() {
    let (_dir, ctx) = workspace();
    // Not named: left out.
    assert_eq!(Glob.call(&ctx, json!({"pattern": "**/*.js"})).await, ToolOutput::ok("no paths"));
    // Named: found.
    let named = [
        (Glob.call(&ctx, json!({"pattern": "node_modules/*/*.js"})).await, "node_modules/pkg/index.js"),
        (Glob.call(&ctx, json!({"pattern": "debug.log"})).await, "debug.log"),
        (Glob.call(&ctx, json!({"pattern": "build/out.txt"})).await, "build/out.txt"),
        (Grep.call(&ctx, json!({"pattern": "needle", "path": "debug.log"})).await, "debug.log:1: needle"),
        (Grep.call(&ctx, json!({"pattern": "needle", "path": "build"})).await, "build/out.txt:1: needle"),
        (Grep.call(&ctx, json!({"pattern": "needle", "path": "vendor"})).await, "vendor/lib.rs:1: needle"),
    ];
    for (output, expected) in named {
        assert_eq!(output, ToolOutput::ok(expected));
    }
}
