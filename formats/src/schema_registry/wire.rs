//! The Confluent wire format: a zero byte, the schema id as 4 big-endian bytes, the payload.

use super::RegistryError;

/// The first byte of every framed payload.
pub const MAGIC: u8 = 0;
/// Bytes before the payload.
pub const PREFIX_LEN: usize = 5;

/// The schema id and the rest of a framed payload.
pub fn split(framed: &[u8]) -> Result<(u32, &[u8]), RegistryError> {
    match framed {
        [MAGIC, a, b, c, d, rest @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), rest)),
        [] => Err(RegistryError::Wire("empty payload: expected the schema registry's framing (a zero byte and a 4-byte schema id)".into())),
        [first, ..] if *first != MAGIC => Err(RegistryError::Wire(format!(
            "payload starts with byte {first:#04x}, not the schema registry's magic byte 0: not written with a registry serializer"
        ))),
        _ => Err(RegistryError::Wire(format!(
            "payload of {} bytes is shorter than the schema registry's 5-byte prefix",
            framed.len()
        ))),
    }
}

/// The prefix of a payload written with schema `id`.
pub fn prefix(id: u32) -> [u8; PREFIX_LEN] {
    let [a, b, c, d] = id.to_be_bytes();
    [MAGIC, a, b, c, d]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_payload_splits_into_its_id_and_body() {
        let mut framed = prefix(258).to_vec();
        framed.extend_from_slice(b"body");
        assert_eq!(split(&framed).unwrap(), (258, &b"body"[..]));
        assert!(split(b"{\"json\":1}")
            .unwrap_err()
            .to_string()
            .contains("0x7b"));
        assert!(split(&[0, 0, 1])
            .unwrap_err()
            .to_string()
            .contains("shorter"));
        assert!(split(&[]).unwrap_err().to_string().contains("empty"));
    }
}
