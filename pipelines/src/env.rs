//! `${VAR}` and `${VAR:-default}` in pipeline files (secrets, broker addresses), substituted
//! into the text before it is parsed.
//!
//! Substitution only changes text within a line (a value holding a line break is refused), so
//! every line number of a later error is still the line of the file as written. `$$` is a
//! literal `$` (so `$${X}` is the text `${X}`); any other `$` is left as it is. Lines that are
//! comments (first non-blank character `#`) are left alone. Values are inserted as they are:
//! a value is never substituted again, and a default is taken literally.
//!
//! Values of variables whose names mark them as secrets are remembered ([`Redactions`]) so that
//! messages and `riffle plan` show `${NAME}` instead of them.

use std::env::VarError;

use thiserror::Error;

/// Upper-case name fragments that mark a variable's value as secret.
const SECRET_MARKERS: [&str; 4] = ["PASSWORD", "SECRET", "TOKEN", "KEY"];

/// A substitution that failed: the line (1-based), the key written before the reference on
/// that line (empty when none), and the problem.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{problem}")]
pub struct EnvError {
    pub line: u64,
    pub key: String,
    pub problem: EnvProblem,
}

/// What is wrong with a `${…}` reference. The variable's value is never part of the message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum EnvProblem {
    #[error(
        "`${{{0}}}`: the environment variable `{0}` is not set and the reference has no \
         default (set it, or write `${{{0}:-default}}`)"
    )]
    Unset(String),
    #[error("`${{{0}}}`: the value of the environment variable `{0}` is not valid UTF-8")]
    NotUnicode(String),
    #[error(
        "`${{{0}}}`: the value of the environment variable `{0}` holds a line break (expected \
         a one-line value)"
    )]
    LineBreak(String),
    #[error("`${{` without a closing `}}` on this line (write `$${{` for a literal `${{`)")]
    Unclosed,
    #[error(
        "`${{{0}}}`: expected `${{NAME}}` or `${{NAME:-default}}`, NAME made of letters, digits \
         and `_`, not starting with a digit (write `$$` for a literal `$`)"
    )]
    Malformed(String),
    #[error("`${{{0}:-…`: a default cannot hold another `${{…}}` (no nesting)")]
    Nested(String),
}

/// Substituted values of secret variables, to keep out of anything shown to the user.
#[derive(Clone, Default)]
pub struct Redactions {
    /// (value, variable name), longest value first.
    secrets: Vec<(String, String)>,
}

impl std::fmt::Debug for Redactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: a debug print must not show the values either.
        f.debug_list()
            .entries(self.secrets.iter().map(|(_, name)| name))
            .finish()
    }
}

impl Redactions {
    /// `text` with every secret value replaced by `${NAME}` of its variable.
    pub fn redact(&self, text: &str) -> String {
        if self.secrets.is_empty() {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        'scan: while let Some(c) = rest.chars().next() {
            for (value, name) in &self.secrets {
                if let Some(after) = rest.strip_prefix(value.as_str()) {
                    out.push_str("${");
                    out.push_str(name);
                    out.push('}');
                    rest = after;
                    continue 'scan;
                }
            }
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    fn add(&mut self, name: &str, value: &str) {
        if value.is_empty() || self.secrets.iter().any(|(v, _)| v == value) {
            return;
        }
        self.secrets.push((value.to_string(), name.to_string()));
        // Longest first: a secret that contains another is replaced whole.
        self.secrets
            .sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
    }
}

/// The pipeline text with every reference replaced, and the secrets it now holds.
pub struct Substituted {
    pub text: String,
    pub redactions: Redactions,
}

/// Whether a variable's value must not be shown (`KAFKA_PASSWORD`, `API_TOKEN`, …).
pub fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_MARKERS.iter().any(|m| upper.contains(m))
}

/// Replaces `${NAME}` and `${NAME:-default}` in `text` with values from `var` (`std::env::var`
/// when loading a file). `${NAME:-default}` takes the default when the variable is unset or
/// empty, as in the shell; `${NAME}` of an unset variable is an error.
pub fn substitute(
    text: &str,
    var: impl Fn(&str) -> Result<String, VarError>,
) -> Result<Substituted, EnvError> {
    let mut out = String::with_capacity(text.len());
    let mut redactions = Redactions::default();
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let number = index as u64 + 1;
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let error = |before: &str, problem| EnvError {
            line: number,
            key: key_before(before),
            problem,
        };
        let mut rest = line;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
                continue;
            }
            let Some(body) = after.strip_prefix('{') else {
                out.push('$');
                rest = after;
                continue;
            };
            let before = &line[..line.len() - rest.len() + at];
            let Some(end) = body.find('}') else {
                return Err(error(before, EnvProblem::Unclosed));
            };
            let reference = &body[..end];
            rest = &body[end + 1..];
            let (name, default) = match reference.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (reference, None),
            };
            if !is_name(name) {
                return Err(error(before, EnvProblem::Malformed(reference.into())));
            }
            if default.is_some_and(|d| d.contains("${")) {
                return Err(error(before, EnvProblem::Nested(name.into())));
            }
            let value = match (var(name), default) {
                (Ok(value), Some(default)) if value.is_empty() => default.to_string(),
                (Ok(value), _) => value,
                (Err(VarError::NotPresent), Some(default)) => default.to_string(),
                (Err(VarError::NotPresent), None) => {
                    return Err(error(before, EnvProblem::Unset(name.into())))
                }
                (Err(VarError::NotUnicode(_)), _) => {
                    return Err(error(before, EnvProblem::NotUnicode(name.into())))
                }
            };
            // YAML breaks lines at CR as well as LF; either would shift every later line.
            if value.contains(['\n', '\r']) {
                return Err(error(before, EnvProblem::LineBreak(name.into())));
            }
            if is_secret(name) {
                redactions.add(name, &value);
            }
            out.push_str(&value);
        }
        out.push_str(rest);
    }
    Ok(Substituted {
        text: out,
        redactions,
    })
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The key a reference is the value of: the last `key:` written before it on its line
/// (`sasl.password: ${P}`, `{ id: a, uri: "${U}" }`); empty when there is none.
fn key_before(before: &str) -> String {
    let Some((keys, _)) = before.rsplit_once(':') else {
        return String::new();
    };
    keys.rsplit([',', '{', '[', '-', ' ', '\t'])
        .find(|k| !k.is_empty())
        .unwrap_or_default()
        .trim_matches(['"', '\''])
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Result<String, VarError> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned().ok_or(VarError::NotPresent)
    }

    fn sub(text: &str, pairs: &[(&str, &str)]) -> Result<String, EnvError> {
        substitute(text, vars(pairs)).map(|s| s.text)
    }

    #[test]
    fn set_variables_are_substituted_within_their_line() {
        let text = "a: 1\nbrokers: ${B}\nuri: \"kafka://${HOST}:${PORT}/x\"\n";
        assert_eq!(
            sub(
                text,
                &[("B", "k1:9092,k2:9092"), ("HOST", "h"), ("PORT", "9")]
            )
            .unwrap(),
            "a: 1\nbrokers: k1:9092,k2:9092\nuri: \"kafka://h:9/x\"\n"
        );
        // No trailing newline, and text without references, stay as they are.
        assert_eq!(sub("x: ${B}", &[("B", "y")]).unwrap(), "x: y");
        assert_eq!(sub("x: 1\n", &[]).unwrap(), "x: 1\n");
    }

    #[test]
    fn defaults_apply_when_unset_or_empty() {
        let text = "brokers: ${RIFFLE_TEST_BROKERS:-127.0.0.1:9092}";
        assert_eq!(sub(text, &[]).unwrap(), "brokers: 127.0.0.1:9092");
        assert_eq!(
            sub(text, &[("RIFFLE_TEST_BROKERS", "")]).unwrap(),
            "brokers: 127.0.0.1:9092"
        );
        assert_eq!(
            sub(text, &[("RIFFLE_TEST_BROKERS", "k:1")]).unwrap(),
            "brokers: k:1"
        );
        // An empty default gives an empty value; `${X}` of an empty variable is empty too.
        assert_eq!(sub("a: '${X:-}'", &[]).unwrap(), "a: ''");
        assert_eq!(sub("a: '${X}'", &[("X", "")]).unwrap(), "a: ''");
        // A default is taken literally, `$` and `:-` included.
        assert_eq!(sub("a: ${X:-$$y:-z}", &[]).unwrap(), "a: $$y:-z");
    }

    #[test]
    fn unset_variable_names_line_key_and_variable() {
        let text = "name: p\nsink:\n  kafka:\n    sasl.password: ${KAFKA_PASSWORD}\n";
        let e = sub(text, &[]).unwrap_err();
        assert_eq!(e.line, 4);
        assert_eq!(e.key, "sasl.password");
        assert_eq!(e.problem, EnvProblem::Unset("KAFKA_PASSWORD".into()));
        let message = e.to_string();
        assert!(message.contains("`KAFKA_PASSWORD` is not set"), "{message}");
        assert!(message.contains("${KAFKA_PASSWORD:-default}"), "{message}");
        // In a flow mapping, the key is the one just before the reference.
        let e = sub("- { id: a, uri: \"${CAM}\" }", &[]).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (1, "uri"));
        let e = sub("${X}", &[]).unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (1, ""));
    }

    #[test]
    fn dollar_dollar_is_a_literal_dollar() {
        assert_eq!(sub("a: $${X}", &[]).unwrap(), "a: ${X}");
        assert_eq!(sub("a: p$$w$$$$d", &[]).unwrap(), "a: p$w$$d");
        assert_eq!(sub("a: $$$${X}", &[]).unwrap(), "a: $${X}");
        // `$$` then a reference.
        assert_eq!(sub("a: $$${X}", &[("X", "1")]).unwrap(), "a: $1");
        // A `$` not followed by `{` or `$` is left alone.
        assert_eq!(sub("a: 5$ $X ^a$", &[]).unwrap(), "a: 5$ $X ^a$");
    }

    #[test]
    fn values_are_not_substituted_again() {
        let text = "a: ${A}\nb: ${B:-${C}x}\n";
        assert_eq!(
            sub("a: ${A} ${D:-$$x}", &[("A", "${B}$$")]).unwrap(),
            "a: ${B}$$ $$x"
        );
        // Nested references in defaults are refused rather than half-expanded.
        let e = sub(text, &[("A", "1")]).unwrap_err();
        assert_eq!((e.line, e.problem), (2, EnvProblem::Nested("B".into())));
    }

    #[test]
    fn comment_lines_are_left_alone() {
        let text = "# sasl.password: ${UNSET}\n  # ${ALSO_UNSET:-x} $$\na: ${A} # ${A}\n";
        assert_eq!(
            sub(text, &[("A", "1")]).unwrap(),
            "# sasl.password: ${UNSET}\n  # ${ALSO_UNSET:-x} $$\na: 1 # 1\n"
        );
    }

    #[test]
    fn line_breaks_in_values_are_refused() {
        for value in ["a\nb", "a\r\nb", "a\rb"] {
            let e = sub("x: 1\ny: ${V}\n", &[("V", value)]).unwrap_err();
            assert!(!e.to_string().contains(value));
            assert_eq!((e.line, e.problem), (2, EnvProblem::LineBreak("V".into())));
        }
    }

    #[test]
    fn malformed_references_are_errors() {
        for (text, reference) in [
            ("a: ${}", ""),
            ("a: ${1X}", "1X"),
            ("a: ${X-d}", "X-d"),
            ("a: ${X:d}", "X:d"),
            ("a: ${A B}", "A B"),
        ] {
            let e = sub(text, &[]).unwrap_err();
            assert_eq!(e.problem, EnvProblem::Malformed(reference.into()), "{text}");
        }
        let e = sub("a: 1\nb: ${X\nc: }\n", &[]).unwrap_err();
        assert_eq!((e.line, e.problem), (2, EnvProblem::Unclosed));
    }

    #[test]
    fn secret_values_are_redacted() {
        let s = substitute(
            "user: ${KAFKA_USER}\npass: ${KAFKA_PASSWORD}\nk: ${API_key}\nt: ${TOKEN:-dflt}\n",
            vars(&[
                ("KAFKA_USER", "alice"),
                ("KAFKA_PASSWORD", "hunter2"),
                ("API_key", "hunter2-long"),
            ]),
        )
        .unwrap();
        assert_eq!(
            s.text,
            "user: alice\npass: hunter2\nk: hunter2-long\nt: dflt\n"
        );
        assert_eq!(
            s.redactions
                .redact("bad value `hunter2-long`, `hunter2`, alice, dflt"),
            "bad value `${API_key}`, `${KAFKA_PASSWORD}`, alice, ${TOKEN}"
        );
        assert!(!format!("{:?}", s.redactions).contains("hunter2"));
        assert!(is_secret("KAFKA_PASSWORD") && is_secret("aws_secret_access_key"));
        assert!(!is_secret("KAFKA_BROKERS"));
    }
}
