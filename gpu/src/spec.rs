//! `device:` in a stage's YAML: where a stage wants to run.

use serde::Deserialize;

/// `device:` — `cpu`, `auto` (CPU where no GPU is usable) or `cuda:N`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Auto,
    Cuda(usize),
}

impl<'de> Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "auto" => Ok(DeviceSpec::Auto),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "expected `cpu`, `auto` or `cuda:N`, found `{other}`"
                    ))
                }),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Auto => write!(f, "auto"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_words_and_display_round_trip() {
        for (text, spec) in [
            ("cpu", DeviceSpec::Cpu),
            ("auto", DeviceSpec::Auto),
            ("cuda:3", DeviceSpec::Cuda(3)),
        ] {
            let parsed: DeviceSpec = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(parsed, spec);
            assert_eq!(spec.to_string(), text);
        }
        let e = serde_json::from_value::<DeviceSpec>(serde_json::json!("gpu")).unwrap_err();
        assert!(
            e.to_string().contains("expected `cpu`, `auto` or `cuda:N`"),
            "{e}"
        );
    }
}
