//! Integer fields of REST bodies. JSON Schema's `integer` is any number without a fractional
//! part, so to a client generated from the OpenAPI document `3.0` is as good as `3` (schemathesis
//! sends both); serde alone refuses `3.0` for a `u32`. These accept a float when it names one
//! integer exactly (no fraction, at most 2^53, where every integer still has its own float) and
//! refuse anything else with a message that says why.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// Largest float below which every integer is exactly representable.
const EXACT_FLOAT_LIMIT: f64 = 9_007_199_254_740_992.0; // 2^53

pub fn whole<'de, D: Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<T, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    let value = to_u64(&number).map_err(D::Error::custom)?;
    T::try_from(value).map_err(|_| D::Error::custom(format!("{number} is too large for this field")))
}

/// `whole` for an optional field: `null` (or an absent field, with `#[serde(default)]`) is `None`.
pub fn optional_whole<'de, D: Deserializer<'de>, T: TryFrom<u64>>(deserializer: D) -> Result<Option<T>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else { return Ok(None) };
    let value = to_u64(&number).map_err(D::Error::custom)?;
    T::try_from(value).map(Some).map_err(|_| D::Error::custom(format!("{number} is too large for this field")))
}

fn to_u64(number: &serde_json::Number) -> Result<u64, String> {
    if let Some(value) = number.as_u64() {
        return Ok(value);
    }
    if number.is_i64() {
        return Err(format!("{number} is negative; expected a non-negative integer"));
    }
    match number.as_f64() {
        Some(f) if f.fract() == 0.0 && (0.0..=EXACT_FLOAT_LIMIT).contains(&f) => Ok(f as u64),
        Some(f) if f.fract() == 0.0 && f > EXACT_FLOAT_LIMIT => {
            Err(format!("{number} is written as a float above 2^53, where floats skip integers; write it without a fraction"))
        }
        _ => Err(format!("{number} is not a non-negative integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug)]
    struct Body {
        #[serde(deserialize_with = "whole")]
        count: u32,
        #[serde(default, deserialize_with = "optional_whole")]
        partition: Option<u32>,
    }

    fn parse(text: &str) -> Result<Body, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn integral_floats_are_integers_and_everything_else_is_refused_with_a_reason() {
        assert_eq!(parse(r#"{"count": 714.0}"#).unwrap().count, 714);
        assert_eq!(parse(r#"{"count": 0.0, "partition": 70000.0}"#).unwrap().partition, Some(70000));
        assert_eq!(parse(r#"{"count": 4294967295}"#).unwrap().count, u32::MAX);
        assert_eq!(parse(r#"{"count": 1, "partition": null}"#).unwrap().partition, None);
        assert_eq!(parse(r#"{"count": 1}"#).unwrap().partition, None);
        assert!(parse(r#"{"count": 4294967296}"#).unwrap_err().contains("too large"));
        assert!(parse(r#"{"count": -1}"#).unwrap_err().contains("negative"));
        assert!(parse(r#"{"count": -0.5}"#).unwrap_err().contains("not a non-negative integer"));
        assert!(parse(r#"{"count": 1.5}"#).unwrap_err().contains("not a non-negative integer"));
        assert!(parse(r#"{"count": 1e300}"#).unwrap_err().contains("2^53"));
        assert!(parse(r#"{"count": "1"}"#).is_err());
    }

    #[test]
    fn u64_fields_keep_every_integer_up_to_the_top() {
        #[derive(Deserialize)]
        struct Offset {
            #[serde(deserialize_with = "whole")]
            offset: u64,
        }
        let top: Offset = serde_json::from_str(r#"{"offset": 18446744073709551615}"#).unwrap();
        assert_eq!(top.offset, u64::MAX);
        let exact: Offset = serde_json::from_str(r#"{"offset": 9007199254740992.0}"#).unwrap();
        assert_eq!(exact.offset, 1 << 53);
        assert!(serde_json::from_str::<Offset>(r#"{"offset": 9223372036854775806.0}"#).is_err());
        assert!(serde_json::from_str::<Offset>(r#"{"offset": 18446744073709551616}"#).is_err());
    }
}
