//! `tls:` and libpq's `sslmode`: which mode a connection uses and what it trusts, settled
//! (files read included) when the sink is checked, so that a bad setting fails validation
//! rather than the first write.

use std::path::PathBuf;

use serde::Deserialize;

/// libpq's `sslmode`, in `tls.mode` or the URL (`?sslmode=verify-full`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain.
    Prefer,
    /// TLS or fail; the certificate is checked only against a `ca_file` given (as libpq does
    /// with a root certificate file), never its host name.
    Require,
    /// TLS, with a certificate signed by the trusted CA; any host name.
    VerifyCa,
    /// TLS, with a certificate signed by the trusted CA and naming the host connected to.
    VerifyFull,
}

impl SslMode {
    const ALL: [SslMode; 5] = [
        SslMode::Disable,
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn parse(value: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == value)
            .ok_or_else(|| {
                format!(
                    "`sslmode={value}` is not a mode: expected disable, prefer, require, \
                     verify-ca or verify-full"
                )
            })
    }
}

/// `tls: { mode, ca_file, client_cert, client_key }`; the files are PEM, relative paths are
/// taken from the pipeline file's folder.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Default `verify-full` (or the URL's `sslmode`).
    #[serde(default)]
    pub mode: Option<SslMode>,
    /// The CA that signed the server's certificate; default: the system's trusted CAs.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// A client certificate (chain), for servers that ask for one (`clientcert=` in
    /// pg_hba.conf); with `client_key`.
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    #[serde(default)]
    pub client_key: Option<PathBuf>,
}

impl TlsConfig {
    pub(super) fn paths_mut(&mut self) -> impl Iterator<Item = &mut PathBuf> {
        [
            self.ca_file.as_mut(),
            self.client_cert.as_mut(),
            self.client_key.as_mut(),
        ]
        .into_iter()
        .flatten()
    }
}

/// A setting that cannot work: the key it is at (`url`, `tls.ca_file`, …) and why.
#[derive(Debug)]
pub(super) struct TlsSettingError {
    pub key: &'static str,
    pub message: String,
}

impl TlsSettingError {
    pub fn new(key: &'static str, message: impl Into<String>) -> Self {
        TlsSettingError {
            key,
            message: message.into(),
        }
    }
}

/// Which certificate checks a TLS connection makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verify {
    Nothing,
    /// Signed by a trusted CA.
    Chain,
    /// Signed by a trusted CA and naming the host.
    ChainAndHost,
}

/// libpq's file parameters, which belong in `tls:` here (resolved against the pipeline file).
const FILE_PARAMETERS: [(&str, &str); 3] = [
    ("sslrootcert", "ca_file"),
    ("sslcert", "client_cert"),
    ("sslkey", "client_key"),
];

/// The connection string without `sslmode`, and the mode it gave: the `postgres` client
/// knows only disable, prefer and require.
pub(super) fn split_url(url: &str) -> Result<(String, Option<SslMode>), String> {
    let is_url = ["postgres://", "postgresql://"]
        .iter()
        .any(|s| url.starts_with(s));
    let (rest, value) = if is_url {
        split_query(url)?
    } else {
        split_pairs(url)?
    };
    Ok((rest, value.as_deref().map(SslMode::parse).transpose()?))
}

fn check_parameter(key: &str) -> Result<(), String> {
    match FILE_PARAMETERS.iter().find(|(k, _)| *k == key) {
        Some((k, field)) => Err(format!(
            "`url` has `{k}`: give the file as `tls.{field}` instead (a path relative to the \
             pipeline file)"
        )),
        None => Ok(()),
    }
}

/// `postgres://…?a=1&sslmode=require&b=2` → (`postgres://…?a=1&b=2`, `require`).
fn split_query(url: &str) -> Result<(String, Option<String>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), None));
    };
    let mut mode = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        check_parameter(key)?;
        if key == "sslmode" {
            mode = Some(value.to_string());
        } else {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, mode))
}

/// `host=h sslmode='verify-full' dbname=d` → (`host=h dbname=d`, `verify-full`); values may
/// be quoted, with backslash escapes, as libpq reads them.
fn split_pairs(text: &str) -> Result<(String, Option<String>), String> {
    let bytes = text.as_bytes();
    let mut mode = None;
    let mut rest = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
            continue;
        }
        let start = i;
        while bytes
            .get(i)
            .is_some_and(|b| *b != b'=' && !b.is_ascii_whitespace())
        {
            i += 1;
        }
        let key = text.get(start..i).unwrap_or_default();
        while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if bytes.get(i) != Some(&b'=') {
            // Not a pair: left for the client to reject.
            return Ok((text.to_string(), None));
        }
        i += 1;
        while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        let mut value = Vec::new();
        let quoted = bytes.get(i) == Some(&b'\'');
        if quoted {
            i += 1;
        }
        while let Some(&b) = bytes.get(i) {
            if (quoted && b == b'\'') || (!quoted && b.is_ascii_whitespace()) {
                break;
            }
            if b == b'\\' {
                i += 1;
            }
            if let Some(&c) = bytes.get(i) {
                value.push(c);
            }
            i += 1;
        }
        if quoted {
            i += 1;
        }
        check_parameter(key)?;
        if key == "sslmode" {
            mode = Some(String::from_utf8_lossy(&value).into_owned());
        } else {
            if !rest.is_empty() {
                rest.push(' ');
            }
            rest.push_str(text.get(start..i.min(text.len())).unwrap_or_default());
        }
    }
    Ok((rest, mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::connector::settle;

    #[test]
    fn sslmode_is_taken_out_of_either_form_of_url() {
        let (rest, mode) =
            split_url("postgres://u:p@h:5432/d?application_name=x&sslmode=verify-full").unwrap();
        assert_eq!(rest, "postgres://u:p@h:5432/d?application_name=x");
        assert_eq!(mode, Some(SslMode::VerifyFull));
        let (rest, mode) = split_url("postgresql://h/d?sslmode=require").unwrap();
        assert_eq!(
            (rest.as_str(), mode),
            ("postgresql://h/d", Some(SslMode::Require))
        );
        let (rest, mode) = split_url("postgres://h/d").unwrap();
        assert_eq!((rest.as_str(), mode), ("postgres://h/d", None));

        let (rest, mode) =
            split_url("host=h password='a b\\'c' sslmode = 'verify-ca'  dbname=d").unwrap();
        assert_eq!(rest, "host=h password='a b\\'c' dbname=d");
        assert_eq!(mode, Some(SslMode::VerifyCa));
        let (rest, mode) = split_url("host=h sslmode=disable").unwrap();
        assert_eq!((rest.as_str(), mode), ("host=h", Some(SslMode::Disable)));
    }

    #[test]
    fn a_wrong_mode_or_a_libpq_file_parameter_is_refused_with_what_to_write() {
        let e = split_url("postgres://h/d?sslmode=verify").unwrap_err();
        assert!(
            e.contains("sslmode=verify") && e.contains("verify-full"),
            "{e}"
        );
        let e = split_url("postgres://h/d?sslrootcert=ca.pem").unwrap_err();
        assert!(
            e.contains("sslrootcert") && e.contains("tls.ca_file"),
            "{e}"
        );
        let e = split_url("host=h sslkey=k.pem").unwrap_err();
        assert!(e.contains("tls.client_key"), "{e}");
    }

    /// `tls` with `mode` and a CA file in `dir` (so no test depends on the system's CAs).
    fn tls(dir: &tempfile::TempDir, mode: Option<SslMode>) -> TlsConfig {
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, super::super::connector::TEST_CA).unwrap();
        TlsConfig {
            mode,
            ca_file: Some(ca),
            ..TlsConfig::default()
        }
    }

    #[test]
    fn the_mode_comes_from_the_url_or_tls_and_defaults_to_plain_without_either() {
        let dir = tempfile::tempdir().unwrap();
        let verify = |url: &str, tls: Option<&TlsConfig>| {
            let s = settle(url, tls).unwrap();
            (s.mode, s.connector.map(|_| s.verify))
        };
        assert_eq!(
            verify("postgres://h/d", None),
            (SslMode::Disable, None),
            "no TLS unless asked for"
        );
        assert_eq!(
            verify("postgres://h/d?sslmode=require", None),
            (SslMode::Require, Some(Verify::Nothing))
        );
        assert_eq!(
            settle("postgres://h/d?sslmode=require", None).unwrap().url,
            "postgres://h/d",
            "the client never sees the mode it does not know"
        );
        assert_eq!(
            verify("postgres://h/d", Some(&tls(&dir, None))),
            (SslMode::VerifyFull, Some(Verify::ChainAndHost)),
            "a `tls` block means verify-full"
        );
        assert_eq!(
            verify("postgres://h/d?sslmode=verify-ca", Some(&tls(&dir, None))),
            (SslMode::VerifyCa, Some(Verify::Chain)),
            "the URL's mode, `tls` agreeing by silence"
        );
        assert_eq!(
            verify("postgres://h/d", Some(&tls(&dir, Some(SslMode::Require)))),
            (SslMode::Require, Some(Verify::Chain)),
            "with a CA, `require` checks the chain, as libpq does with a root certificate"
        );
        let no_ca = TlsConfig {
            mode: Some(SslMode::Prefer),
            ..TlsConfig::default()
        };
        assert_eq!(
            verify("host=h", Some(&no_ca)),
            (SslMode::Prefer, Some(Verify::Nothing))
        );

        let e = settle(
            "postgres://h/d?sslmode=require",
            Some(&tls(&dir, Some(SslMode::VerifyFull))),
        )
        .err()
        .unwrap();
        assert_eq!(e.key, "tls.mode");
        assert!(
            e.message.contains("require") && e.message.contains("verify-full"),
            "{e:?}"
        );
    }

    #[test]
    fn tls_yaml_takes_the_documented_keys_only() {
        let t: TlsConfig = serde_json::from_value(serde_json::json!({
            "mode": "verify-ca", "ca_file": "ca.pem", "client_cert": "c.pem", "client_key": "k.pem"
        }))
        .unwrap();
        assert_eq!(t.mode, Some(SslMode::VerifyCa));
        let mut t = t;
        assert_eq!(t.paths_mut().count(), 3);
        let e = serde_json::from_value::<TlsConfig>(serde_json::json!({"mode": "verify_full"}))
            .unwrap_err();
        assert!(e.to_string().contains("verify-full"), "{e}");
        assert!(serde_json::from_value::<TlsConfig>(serde_json::json!({"cafile": "x"})).is_err());
    }
}
