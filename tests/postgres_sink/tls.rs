//! The sink over TLS, against the server's own CA (`RIFFLE_PG_CA`). The users prove TLS was
//! used: `riffle_tls` is refused without it, and `riffle_cert` logs in by its client
//! certificate alone. Passwords come from the environment (`${RIFFLE_PG_TLS_PASSWORD}` in the
//! URL), never from the file.

use std::path::Path;
use std::process::{Command, Output};

use super::common::postgres::{self, query, scalar, table, Tls};
use super::common::write;
use super::pipeline;

/// `riffle` with the password of `riffle_tls` in the environment.
fn riffle(tls: &Tls, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_riffle"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env("RIFFLE_PG_TLS_PASSWORD", tls.password())
        .output()
        .expect("running the riffle binary")
}

fn fails(tls: &Tls, args: &[&str]) -> String {
    let out = riffle(tls, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} fails: {stderr}");
    assert!(
        !stderr.contains(tls.password()),
        "the password is not shown: {stderr}"
    );
    stderr
}

fn succeeds(tls: &Tls, args: &[&str]) {
    let out = riffle(tls, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pipeline writing `rows` ids (and `value = id * 2`) to `t` through `url` and `tls`.
fn tls_pipeline(dir: &Path, t: &str, url: &str, tls: &str, rows: usize) -> String {
    let mut csv = String::from("id,value\n");
    for i in 0..rows {
        csv.push_str(&format!("{i},{}\n", i * 2));
    }
    let input = write(dir, "ids.csv", &csv);
    let sink = format!("  postgres:\n    url: \"{url}\"\n    table: {t}\n{tls}");
    let source = format!("  csv: {{ path: \"{}\", batch_size: 64 }}", input.display());
    let p = pipeline(dir, "pg-tls", &source, &sink, "{ workers: 1 }");
    p.to_str().unwrap().to_string()
}

/// The URL of `riffle_tls` at `host`, its password from the environment.
fn tls_url(tls: &Tls, host: &str, query: &str) -> String {
    let url = format!(
        "postgres://riffle_tls:${{RIFFLE_PG_TLS_PASSWORD}}@{host}:{}/riffle",
        tls.port()
    );
    if query.is_empty() {
        url
    } else {
        format!("{url}?{query}")
    }
}

#[test]
fn a_run_with_verify_full_and_the_servers_ca_lands_every_row_over_tls() {
    let tls = postgres::tls();
    let tmp = tempfile::tempdir().unwrap();
    // A path relative to the pipeline file, which is not where riffle runs.
    std::fs::create_dir(tmp.path().join("certs")).unwrap();
    std::fs::copy(&tls.ca, tmp.path().join("certs/ca.pem")).unwrap();
    let t = table("tls_full");
    let p = tls_pipeline(
        tmp.path(),
        &t,
        &tls_url(&tls, "127.0.0.1", "sslmode=verify-full"),
        "    tls: { ca_file: certs/ca.pem }\n",
        500,
    );
    succeeds(&tls, &["run", "-q", &p]);
    let url = postgres::url();
    assert_eq!(
        query(
            &url,
            &format!("SELECT count(*), count(DISTINCT id), sum(value) FROM {t}")
        )[0],
        ["500", "500", (499 * 500).to_string().as_str()],
        "every row once"
    );
    assert_eq!(
        scalar(
            &url,
            &format!("SELECT tableowner FROM pg_tables WHERE tablename = '{t}'")
        ),
        "riffle_tls",
        "written by the user the server lets in only over TLS"
    );
}

#[test]
fn without_tls_the_tls_only_user_is_refused_so_the_tls_tests_prove_tls() {
    let tls = postgres::tls();
    let tmp = tempfile::tempdir().unwrap();
    for query in ["sslmode=disable", "application_name=plain"] {
        let p = tls_pipeline(
            tmp.path(),
            &table("tls_none"),
            &tls_url(&tls, "127.0.0.1", query),
            "",
            1,
        );
        let stderr = fails(&tls, &["validate", &p]);
        assert!(
            stderr.contains("refuses this user without TLS") && stderr.contains("no encryption"),
            "{query}: {stderr}"
        );
    }
}

#[test]
fn a_ca_that_did_not_sign_the_servers_certificate_fails_at_start_naming_verification() {
    let tls = postgres::tls();
    let tmp = tempfile::tempdir().unwrap();
    let other = postgres::unrelated_ca(tmp.path());
    let t = table("tls_wrong_ca");
    let p = tls_pipeline(
        tmp.path(),
        &t,
        &tls_url(&tls, "127.0.0.1", "sslmode=verify-ca"),
        &format!("    tls: {{ ca_file: \"{}\" }}\n", other.display()),
        1,
    );
    let stderr = fails(&tls, &["run", "-q", &p]);
    for part in [
        "certificate verification failed",
        "not signed by",
        other.to_str().unwrap(),
    ] {
        assert!(stderr.contains(part), "the error says {part}: {stderr}");
    }
    assert_eq!(
        scalar(
            &postgres::url(),
            &format!("SELECT to_regclass('{t}') IS NULL")
        ),
        "t",
        "nothing was created"
    );

    // A CA file that is not there is named, with the key, before any connection.
    let p = tls_pipeline(
        tmp.path(),
        &t,
        &tls_url(&tls, "127.0.0.1", ""),
        "    tls: { ca_file: no/such/ca.pem }\n",
        1,
    );
    let stderr = fails(&tls, &["validate", &p]);
    let missing = tmp.path().join("no/such/ca.pem");
    assert!(
        stderr.contains(&missing.display().to_string()) && stderr.contains("tls.ca_file"),
        "the error names the key and the path, resolved: {stderr}"
    );
}

#[test]
fn verify_full_refuses_a_host_name_the_certificate_lacks_and_verify_ca_does_not_check_it() {
    let tls = postgres::tls();
    let tmp = tempfile::tempdir().unwrap();
    let ca = tls.ca.display().to_string();
    let block = format!("    tls: {{ ca_file: \"{ca}\" }}\n");
    // The name the handshake checks, at the server's address.
    let host = "riffle-wrong-name.invalid";
    let p = tls_pipeline(
        tmp.path(),
        &table("tls_name"),
        &tls_url(&tls, host, "hostaddr=127.0.0.1&sslmode=verify-full"),
        &block,
        1,
    );
    let stderr = fails(&tls, &["validate", &p]);
    assert!(
        stderr.contains("certificate verification failed")
            && stderr.contains(&format!("does not match the host name `{host}`"))
            && stderr.contains("verify-ca"),
        "{stderr}"
    );

    let p = tls_pipeline(
        tmp.path(),
        &table("tls_name"),
        &tls_url(&tls, host, "hostaddr=127.0.0.1&sslmode=verify-ca"),
        &block,
        1,
    );
    succeeds(&tls, &["validate", &p]);
}

#[test]
fn a_client_certificate_logs_in_the_user_it_names() {
    let tls = postgres::tls();
    let tmp = tempfile::tempdir().unwrap();
    let t = table("tls_cert");
    let url = format!("postgres://riffle_cert@{}/riffle", tls.address());
    let block = format!(
        "    tls:\n      mode: verify-full\n      ca_file: \"{}\"\n      client_cert: \
         \"{}\"\n      client_key: \"{}\"\n",
        tls.ca.display(),
        tls.client_cert.display(),
        tls.client_key.display()
    );
    let p = tls_pipeline(tmp.path(), &t, &url, &block, 40);
    succeeds(&tls, &["run", "-q", &p]);
    assert_eq!(
        query(
            &postgres::url(),
            &format!(
                "SELECT count(*), max(id), (SELECT tableowner FROM pg_tables \
                 WHERE tablename = '{t}') FROM {t}"
            )
        )[0],
        ["40", "39", "riffle_cert"]
    );

    // Without it, the server refuses the user.
    let block = format!("    tls: {{ ca_file: \"{}\" }}\n", tls.ca.display());
    let p = tls_pipeline(tmp.path(), &table("tls_cert"), &url, &block, 1);
    let stderr = fails(&tls, &["validate", &p]);
    assert!(stderr.contains("client certificate"), "{stderr}");
}
