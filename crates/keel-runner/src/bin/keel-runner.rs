//! A standalone runner executable, for embedders whose own binary does not
//! call `keel_runner::run_if_requested` (keel's own binaries do). Started
//! as `keel-runner __keel-runner` by a [`keel_runner::RunnerPool`].

fn main() {
    keel_runner::run_if_requested();
    eprintln!("keel-runner is started by keel, not by hand: it reads a sandbox policy and tool calls on stdin");
    std::process::exit(2);
}
