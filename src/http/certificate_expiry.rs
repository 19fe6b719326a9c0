//! When an X.509 certificate expires: its `notAfter`, read from the DER bytes with a small walk of
//! the structure (no parser crate for one field). Exported as `ackgate_tls_cert_expiry_timestamp_seconds`
//! so an alert fires weeks before clients start refusing the gateway.
//!
//! RFC 5280: `Certificate ::= SEQUENCE { tbsCertificate, ... }`, `TBSCertificate ::= SEQUENCE {
//! [0] version OPTIONAL, serialNumber, signature, issuer, validity, ... }`, `Validity ::=
//! SEQUENCE { notBefore Time, notAfter Time }`, `Time ::= UTCTime | GeneralizedTime`.

const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// `notAfter` of a DER certificate in seconds since the epoch; `None` when the bytes are not a
/// certificate this walk understands.
pub fn not_after(der: &[u8]) -> Option<u64> {
    let (tag, certificate, _) = element(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, mut tbs, _) = element(certificate)?;
    if tag != SEQUENCE {
        return None;
    }
    // The version is optional (absent: v1); then serial, signature algorithm, issuer.
    if tbs.first() == Some(&VERSION) {
        tbs = element(tbs)?.2;
    }
    for _ in 0..3 {
        tbs = element(tbs)?.2;
    }
    let (tag, validity, _) = element(tbs)?;
    if tag != SEQUENCE {
        return None;
    }
    let not_before_rest = element(validity)?.2;
    let (tag, time, _) = element(not_before_rest)?;
    parse_time(tag, time)
}

/// One DER element: its tag, its content and what follows it.
fn element(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        // Long form: the low bits count the length's bytes (at most 4 here: a certificate is
        // never 4 GiB).
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (digits, after) = rest.split_at(count);
        rest = after;
        digits.iter().fold(0usize, |len, d| (len << 8) | usize::from(*d))
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// `YYMMDDHHMMSSZ` (UTCTime: years 1950 to 2049) or `YYYYMMDDHHMMSSZ` (GeneralizedTime).
fn parse_time(tag: u8, time: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(time).ok()?.strip_suffix('Z')?;
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| text.get(range)?.parse::<u64>().ok();
    let (year, rest) = match (tag, text.len()) {
        (UTC_TIME, 12) => {
            let yy = number(0..2)?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, 2)
        }
        (GENERALIZED_TIME, 14) => (number(0..4)?, 4),
        _ => return None,
    };
    let (month, day) = (number(rest..rest + 2)?, number(rest + 2..rest + 4)?);
    let (hour, minute, second) = (number(rest + 4..rest + 6)?, number(rest + 6..rest + 8)?, number(rest + 8..rest + 10)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 || year < 1970 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`, for years from 1970 on).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate_until(year: i32, month: u8, day: u8) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn not_after_is_read_from_utc_and_generalized_times() {
        // 2030 is written as UTCTime, 2050 and later as GeneralizedTime (RFC 5280).
        assert_eq!(not_after(&certificate_until(2030, 6, 15)), Some(1_907_712_000));
        assert_eq!(not_after(&certificate_until(2050, 1, 1)), Some(2_524_608_000));
        assert_eq!(not_after(&certificate_until(2024, 2, 29)), Some(1_709_164_800));
        assert_eq!(not_after(&certificate_until(4096, 1, 1)), Some(67_090_118_400));
    }

    #[test]
    fn what_is_not_a_certificate_has_no_expiry() {
        let good = certificate_until(2030, 6, 15);
        for cut in [0, 1, 2, 10, good.len() / 2, good.len() - 1] {
            // A cut certificate's outer length no longer fits: never a panic, never a date.
            assert_eq!(not_after(&good[..cut]), None, "cut at {cut}");
        }
        assert_eq!(not_after(b"not a certificate"), None);
        assert_eq!(not_after(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(not_after(&[0x30, 0x80]), None);
        assert_eq!(parse_time(UTC_TIME, b"301301000000Z"), None, "month 13");
        assert_eq!(parse_time(UTC_TIME, b"30061500000Z"), None, "a digit short");
        assert_eq!(parse_time(GENERALIZED_TIME, b"20300615000000"), None, "no Z");
        assert_eq!(parse_time(GENERALIZED_TIME, b"2030061500+000Z"), None);
    }
}
