//! Address ranges as `server.trusted_proxies` names them: `10.0.0.0/8`, `2001:db8::/32`, or one
//! address (`127.0.0.1`, a whole /32 or /128). Parsed here, where the configuration is checked,
//! and matched by the HTTP edge (`http::forwarded`).

use std::net::IpAddr;

/// A network: the addresses whose first `prefix` bits are those of `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    base: IpAddr,
    prefix: u8,
}

impl AddressRange {
    /// `None` when `text` is not an address or `address/prefix` with a prefix the family allows.
    pub fn parse(text: &str) -> Option<Self> {
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let base: IpAddr = address.parse().ok()?;
        let bits = if base.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            // Digits only: "+8" and " 8" parse as u8 but are not a prefix anyone writes.
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse::<u8>().ok().filter(|&p| p <= bits)?,
            Some(_) => return None,
            None => bits,
        };
        Some(Self { base, prefix })
    }

    /// The prefix length (0: every address).
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in the range; an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, as a dual-stack
    /// listener reports IPv4 peers) counts as its IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.base, ip.to_canonical()) {
            (IpAddr::V4(base), IpAddr::V4(ip)) => same_prefix(u32::from(base).into(), u32::from(ip).into(), 32, self.prefix),
            (IpAddr::V6(base), IpAddr::V6(ip)) => same_prefix(u128::from(base), u128::from(ip), 128, self.prefix),
            _ => false,
        }
    }
}

/// Whether the first `prefix` of the `bits` low bits of `a` and `b` agree.
fn same_prefix(a: u128, b: u128, bits: u8, prefix: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let shift = bits - prefix;
    (a >> shift) == (b >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ranges_contain_what_their_prefix_covers() {
        let net = AddressRange::parse("10.1.0.0/16").unwrap();
        assert!(net.contains(ip("10.1.255.7")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(net.contains(ip("::ffff:10.1.2.3")), "an IPv4-mapped peer is its IPv4 address");
        assert!(!net.contains(ip("2001:db8::1")));
        let one = AddressRange::parse("127.0.0.1").unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let v6 = AddressRange::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(AddressRange::parse("0.0.0.0/0").unwrap().contains(ip("203.0.113.9")));
        assert!(AddressRange::parse("::/0").unwrap().contains(ip("::1")));
    }

    #[test]
    fn malformed_ranges_are_refused() {
        for bad in
            ["", "10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/+8", "10.0.0.0/-1", "10.0.0/8", "localhost", "10.0.0.0/8/8", "10.0.0.0/99999999999999999999"]
        {
            assert!(AddressRange::parse(bad).is_none(), "{bad:?}");
        }
    }
}
