//! Requests through a reverse proxy (`server.trusted_proxies`). Behind nginx every connection
//! comes from the proxy's address and speaks plain HTTP, so without this the per-IP limit counts
//! every user as one, the logs and `/admin/sessions` name the proxy, and a page served over
//! `https://` fails the Origin check (its origin is not `http://` plus the Host).
//!
//! A request whose peer is in `server.trusted_proxies` and that carries `X-Forwarded-For` or
//! `Forwarded` (RFC 7239) is believed: its client is the nearest address in the chain that is not
//! a trusted proxy (walking from the peer back), its scheme the last `X-Forwarded-Proto` (or the
//! `proto=` of the last `Forwarded` element), its host the last `X-Forwarded-Host` (or `host=`):
//! what the nearest proxy wrote. Anyone else's forwarding headers are ignored: a client could
//! otherwise name any address it likes. A cross-origin page cannot make a browser send these
//! headers (no preflight ackgate answers allows them); a DNS-rebinding page on a trusted address
//! can, same-origin, and is refused by the Host check on its own `Host` (`http::exposure`).

use std::net::IpAddr;

use axum::http::HeaderMap;

use crate::config::address_range::AddressRange;

/// What a trusted proxy says of a request's client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    pub client: IpAddr,
    /// `"http"` or `"https"`, when the proxy said.
    pub scheme: Option<&'static str>,
    /// The `Host` the client sent the proxy, when the proxy said.
    pub host: Option<String>,
}

/// The proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<AddressRange>);

impl TrustedProxies {
    /// From `server.trusted_proxies` (validated at start: an entry that does not parse is skipped).
    pub fn new(ranges: &[String]) -> Self {
        Self(ranges.iter().filter_map(|r| AddressRange::parse(r)).collect())
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|range| range.contains(ip))
    }

    /// What the proxy at `peer` says of the request, or `None` when `peer` is not trusted or the
    /// request names no client.
    pub fn forwarded(&self, peer: IpAddr, headers: &HeaderMap) -> Option<Forwarded> {
        if !self.trusts(peer) {
            return None;
        }
        let values = |name: &str| -> Vec<String> {
            headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(|v| v.trim().to_string()).collect()
        };
        let x_forwarded_for = values("x-forwarded-for");
        let rfc7239: Vec<Vec<(String, String)>> = values("forwarded").iter().map(|element| parse_element(element)).collect();
        let hops: Vec<Option<IpAddr>> = if !x_forwarded_for.is_empty() {
            x_forwarded_for.iter().map(|hop| parse_node(hop)).collect()
        } else if !rfc7239.is_empty() {
            rfc7239.iter().map(|pairs| pairs.iter().find(|(k, _)| k == "for").and_then(|(_, v)| parse_node(v))).collect()
        } else {
            return None;
        };
        // From the peer back: the first hop that is not a trusted proxy is the client. A hop that
        // is not an address ("unknown", an obfuscated name) ends the walk at the proxy after it.
        let mut client = peer;
        for hop in hops.iter().rev() {
            match hop {
                Some(ip) => {
                    client = *ip;
                    if !self.trusts(*ip) {
                        break;
                    }
                }
                None => break,
            }
        }
        // Scheme and host: what the nearest trusted proxy wrote, the last value (one that appends
        // leaves a client's own before it), from the header family the client came from.
        let (proto, host) = if !x_forwarded_for.is_empty() {
            (values("x-forwarded-proto").pop(), values("x-forwarded-host").pop())
        } else {
            let last = |key: &str| rfc7239.last().and_then(|pairs| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()));
            (last("proto"), last("host"))
        };
        let scheme = proto.and_then(|s| match s.to_ascii_lowercase().as_str() {
            "https" | "wss" => Some("https"),
            "http" | "ws" => Some("http"),
            _ => None,
        });
        let host = host.filter(|h| !h.is_empty());
        Some(Forwarded { client: client.to_canonical(), scheme, host })
    }
}

/// One element of `Forwarded` (`for=192.0.2.60;proto=https`): its pairs, keys lower-cased,
/// quotes removed.
fn parse_element(element: &str) -> Vec<(String, String)> {
    element.split(';').filter_map(|pair| pair.split_once('=')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"').to_string())).collect()
}

/// A node as proxies write it: `192.0.2.60`, `192.0.2.60:4711`, `[2001:db8::1]:4711`, `2001:db8::1`.
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        return rest.split_once(']').and_then(|(inside, _)| inside.parse().ok());
    }
    text.rsplit_once(':').and_then(|(ip, _port)| ip.parse::<std::net::Ipv4Addr>().ok()).map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, v.parse().unwrap());
        }
        map
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::new(&["127.0.0.1".into(), "10.0.0.0/8".into()])
    }

    #[test]
    fn only_a_trusted_peer_is_believed() {
        let h = headers(&[("x-forwarded-for", "203.0.113.9"), ("x-forwarded-proto", "https")]);
        assert_eq!(proxies().forwarded(ip("198.51.100.1"), &h), None, "an untrusted peer names nobody");
        let f = proxies().forwarded(ip("127.0.0.1"), &h).unwrap();
        assert_eq!((f.client, f.scheme), (ip("203.0.113.9"), Some("https")));
        assert_eq!(proxies().forwarded(ip("127.0.0.1"), &HeaderMap::new()), None, "no forwarding header: not forwarded");
    }

    #[test]
    fn the_client_is_the_nearest_untrusted_hop() {
        // A client can prepend anything: only the hops the trusted proxies added count.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.0.0.5")]);
        assert_eq!(proxies().forwarded(ip("10.0.0.6"), &h).unwrap().client, ip("203.0.113.9"));
        let h = headers(&[("x-forwarded-for", "1.1.1.1"), ("x-forwarded-for", "203.0.113.9")]);
        assert_eq!(proxies().forwarded(ip("127.0.0.1"), &h).unwrap().client, ip("203.0.113.9"), "repeated headers are one list");
        let h = headers(&[("x-forwarded-for", "10.0.0.7, 10.0.0.5")]);
        assert_eq!(proxies().forwarded(ip("127.0.0.1"), &h).unwrap().client, ip("10.0.0.7"), "all trusted: the farthest");
        let h = headers(&[("x-forwarded-for", "203.0.113.9, unknown")]);
        assert_eq!(proxies().forwarded(ip("127.0.0.1"), &h).unwrap().client, ip("127.0.0.1"), "an unknown hop: the proxy after it");
    }

    #[test]
    fn rfc_7239_forwarded_is_read_when_x_forwarded_for_is_absent() {
        let h = headers(&[("forwarded", r#"for="[2001:db8::7]:4711", for=10.0.0.5;proto=https;host=gw.example.com"#)]);
        let f = proxies().forwarded(ip("127.0.0.1"), &h).unwrap();
        assert_eq!(f, Forwarded { client: ip("2001:db8::7"), scheme: Some("https"), host: Some("gw.example.com".into()) });
        let h = headers(&[("forwarded", "for=192.0.2.60:8000;proto=http")]);
        assert_eq!(proxies().forwarded(ip("127.0.0.1"), &h).unwrap().client, ip("192.0.2.60"));
    }

    #[test]
    fn the_nearest_proxys_scheme_and_host_win_over_a_clients_own() {
        // A client sent its own X-Forwarded-Proto/Host; a proxy that appends put its own after.
        let h = headers(&[("x-forwarded-for", "203.0.113.9"), ("x-forwarded-proto", "http, https"), ("x-forwarded-host", "evil.example, gw.example.com")]);
        let f = proxies().forwarded(ip("127.0.0.1"), &h).unwrap();
        assert_eq!((f.scheme, f.host.as_deref()), (Some("https"), Some("gw.example.com")));
        // No falling back to the other family: X-Forwarded-For without a host names none.
        let h = headers(&[("x-forwarded-for", "203.0.113.9"), ("forwarded", "for=1.2.3.4;host=evil.example")]);
        assert_eq!(proxies().forwarded(ip("127.0.0.1"), &h).unwrap().host, None);
    }

    #[test]
    fn odd_schemes_are_ignored() {
        let h = headers(&[("x-forwarded-for", "203.0.113.9"), ("x-forwarded-proto", "gopher"), ("x-forwarded-host", "gw.example.com")]);
        let f = proxies().forwarded(ip("127.0.0.1"), &h).unwrap();
        assert_eq!((f.scheme, f.host.as_deref()), (None, Some("gw.example.com")));
    }
}
