//! Session ids: the registration number (for operators, who read the order of sessions from it)
//! and 128 random bits, so that an id cannot be guessed. An SSE session's id is in its `ack_url`,
//! and a guessed one would let anyone holding the client's credentials post frames to it and
//! probe which sessions exist.

use ring::rand::{SecureRandom, SystemRandom};

/// `s<number in hex>-<32 hex digits>`.
pub fn new_session_id(number: u64) -> String {
    let mut bits = [0u8; 16];
    // The system's random source fails only when the kernel has none to give (never after boot);
    // the id is then still unique by its number, only guessable.
    if SystemRandom::new().fill(&mut bits).is_err() {
        tracing::error!("the system random source failed: session id {number} is not random");
    }
    format!("s{number:x}-{:032x}", u128::from_be_bytes(bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_carry_128_random_bits() {
        let (a, b) = (new_session_id(10), new_session_id(10));
        assert_ne!(a, b, "the same number, different ids");
        assert!(a.starts_with("sa-") && a.len() == 3 + 32, "{a}");
        assert!(a[3..].chars().all(|c| c.is_ascii_hexdigit()));
    }
}
