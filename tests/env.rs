//! `${VAR}` and `${VAR:-default}` in pipeline files, through `riffle validate` and `riffle plan`:
//! values from the environment, defaults, an unset variable named with its file and line, and
//! secrets kept out of messages.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{line_of, write};

/// `riffle ARGS` with exactly these `RIFFLE_TEST_*` variables set (others of that prefix
/// removed, whatever the test's own environment holds).
fn riffle_with(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_riffle"));
    command.args(args).env("RUST_LOG", "warn");
    for (name, _) in std::env::vars() {
        if name.starts_with("RIFFLE_TEST_") {
            command.env_remove(name);
        }
    }
    for (name, value) in vars {
        command.env(name, value);
    }
    command.output().expect("running the riffle binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A CSV source into a Kafka sink (validation needs no broker), `sink_extra` added to the
/// sink's block.
fn pipeline(dir: &Path, sink_extra: &str) -> std::path::PathBuf {
    write(dir, "in.csv", "user,item\n1,2\n3,4\n");
    let yaml = format!(
        "# brokers and secrets come from the environment\n\
         name: env-test\n\
         source:\n  csv: {{ path: ${{RIFFLE_TEST_DIR}}/in.csv }}\n\
         stages: []\n\
         sink:\n  kafka:\n    brokers: ${{RIFFLE_TEST_BROKERS:-127.0.0.1:9092}}\n    topic: out\n{sink_extra}"
    );
    write(dir, "p.yaml", &yaml)
}

#[test]
fn validate_substitutes_values_and_defaults() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let file = pipeline(tmp.path(), "");
    let file_arg = file.to_str().unwrap();
    // The brokers' default applies; the source path comes from RIFFLE_TEST_DIR.
    for vars in [
        vec![("RIFFLE_TEST_DIR", dir)],
        vec![
            ("RIFFLE_TEST_DIR", dir),
            ("RIFFLE_TEST_BROKERS", "k1:9092,k2:9092"),
        ],
    ] {
        let out = riffle_with(&["validate", file_arg], &vars);
        assert!(
            out.status.success(),
            "{vars:?}\nstdout:\n{}\nstderr:\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("user: Int64"),
            "{}",
            text(&out.stdout)
        );
    }
    // A value that changes the outcome shows it was used: no such directory.
    let out = riffle_with(
        &["validate", file_arg],
        &[("RIFFLE_TEST_DIR", "/nonexistent")],
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    let line = line_of(&file, "csv:");
    assert!(
        stderr.contains(&format!(
            "{file_arg}:{line}: source.path: `/nonexistent/in.csv`"
        )),
        "{stderr}"
    );
}

#[test]
fn unset_variable_names_file_line_and_variable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let file = pipeline(
        tmp.path(),
        "    options:\n      sasl.password: ${RIFFLE_TEST_UNSET_PASSWORD}\n",
    );
    let file_arg = file.to_str().unwrap();
    let line = line_of(&file, "sasl.password");
    for command in ["validate", "plan"] {
        let out = riffle_with(&[command, file_arg], &[("RIFFLE_TEST_DIR", dir)]);
        assert!(!out.status.success(), "{command} succeeded");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "error: {file_arg}:{line}: sasl.password: `${{RIFFLE_TEST_UNSET_PASSWORD}}`: \
                 the environment variable `RIFFLE_TEST_UNSET_PASSWORD` is not set"
            )),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn secret_values_stay_out_of_messages_and_lines_stay_the_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    // librdkafka quotes a value it refuses; the value is a secret's.
    let file = pipeline(
        tmp.path(),
        "    options:\n      sasl.password: ${RIFFLE_TEST_PASSWORD}\n      \
         compression.type: ${RIFFLE_TEST_TOKEN}\n",
    );
    let file_arg = file.to_str().unwrap();
    let secret = "s3cr3t-zzz";
    let out = riffle_with(
        &["validate", file_arg],
        &[
            ("RIFFLE_TEST_DIR", dir),
            ("RIFFLE_TEST_PASSWORD", "hunter2"),
            ("RIFFLE_TEST_TOKEN", secret),
        ],
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(!stderr.contains(secret), "{stderr}");
    assert!(stderr.contains("${RIFFLE_TEST_TOKEN}"), "{stderr}");
    assert!(
        stderr.contains(&format!("{file_arg}:{}: sink:", line_of(&file, "kafka:"))),
        "{stderr}"
    );

    // A type error on a line after substitutions: the line is the file's, the value hidden.
    let file = write(
        tmp.path(),
        "q.yaml",
        "source:\n  csv: { path: ${RIFFLE_TEST_DIR}/in.csv, has_header: ${RIFFLE_TEST_KEY} }\n\
         stages: []\nsink: { stdout: {} }\n",
    );
    let out = riffle_with(
        &["validate", file.to_str().unwrap()],
        &[("RIFFLE_TEST_DIR", dir), ("RIFFLE_TEST_KEY", secret)],
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(!stderr.contains(secret), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:2: ", file.display())),
        "{stderr}"
    );
}

#[test]
fn plan_never_shows_a_secret() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let file = pipeline(tmp.path(), "");
    // The plan names the pipeline.
    let yaml = std::fs::read_to_string(&file)
        .unwrap()
        .replace("name: env-test", "name: ${RIFFLE_TEST_SECRET}");
    std::fs::write(&file, yaml).unwrap();
    let out = riffle_with(
        &["plan", file.to_str().unwrap()],
        &[
            ("RIFFLE_TEST_DIR", dir),
            ("RIFFLE_TEST_SECRET", "s3cr3t-zzz"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("pipeline: ${RIFFLE_TEST_SECRET} ("),
        "{stdout}"
    );
    assert!(!stdout.contains("s3cr3t-zzz"), "{stdout}");
}
