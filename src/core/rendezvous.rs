//! Rendezvous (highest random weight) hashing: which instance a client should use. Every
//! instance computes the same answer from the same healthy set, and when an instance leaves only
//! its own clients move.

/// The candidate with the highest weight for `client_id`; `None` when there are none.
pub fn pick<'a, T>(client_id: &str, candidates: &'a [T], url: impl Fn(&T) -> &str) -> Option<&'a T> {
    candidates.iter().max_by_key(|c| (weight(client_id, url(c)), url(c).to_string()))
}

/// A stable 64-bit weight (FNV-1a, then a final mix so near-identical URLs spread well).
fn weight(client_id: &str, url: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in client_id.bytes().chain([0u8]).chain(url.bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://10.0.0.{i}:8080")).collect()
    }

    #[test]
    fn every_instance_agrees_and_only_the_leavers_clients_move() {
        let all = urls(5);
        let picks: Vec<String> = (0..1000).map(|c| pick(&format!("client-{c}"), &all, |u| u).unwrap().clone()).collect();
        // Spread: each of 5 instances gets a fair share (expected 200).
        for url in &all {
            let share = picks.iter().filter(|p| *p == url).count();
            assert!((120..=280).contains(&share), "{url} got {share} of 1000");
        }
        let without_two: Vec<String> = all.iter().filter(|u| !u.ends_with(".2:8080")).cloned().collect();
        for (c, before) in picks.iter().enumerate() {
            let after = pick(&format!("client-{c}"), &without_two, |u| u).unwrap();
            if !before.ends_with(".2:8080") {
                assert_eq!(after, before, "client-{c} moved although its instance stayed");
            }
        }
        assert!(pick("x", &Vec::<String>::new(), |u| u).is_none());
    }
}
