//! Connections counted in all and per IP address (`limits.max_connections`,
//! `limits.max_connections_per_ip`): a slot per open connection, given back when it drops, and
//! the answer a refused one gets.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct ConnectionCounts {
    pub(super) open: AtomicUsize,
    pub(super) per_ip: Mutex<HashMap<IpAddr, usize>>,
    pub(super) refusing: AtomicUsize,
}

/// One counted connection; dropping it releases the count.
pub struct ConnectionSlot {
    counts: Arc<ConnectionCounts>,
    ip: Option<IpAddr>,
    /// Counted in `open` too (a forwarded client's slot is only counted per IP: its proxy's
    /// connection holds the slot in all).
    in_all: bool,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if self.in_all {
            self.counts.open.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(ip) = self.ip {
            let mut per_ip = self.counts.per_ip.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = per_ip.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    per_ip.remove(&ip);
                }
            }
        }
    }
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `limits.max_connections` reached: 503 `unavailable`.
    Capacity,
    /// `limits.max_connections_per_ip` reached: 429 `limit_exceeded`.
    PerIp,
}

impl Refusal {
    /// One of `metrics::CONNECTION_REFUSALS`.
    pub(super) fn label(self) -> &'static str {
        match self {
            Refusal::Capacity => "capacity",
            Refusal::PerIp => "per_ip",
        }
    }

    /// Status line, error code and message.
    fn parts(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Refusal::Capacity => {
                ("503 Service Unavailable", "unavailable", "this instance has no room for more connections; retry later or use another instance")
            }
            Refusal::PerIp => ("429 Too Many Requests", "limit_exceeded", "too many connections from this address (limits.max_connections_per_ip)"),
        }
    }

    /// The error body, as `ApiError` writes one.
    pub(super) fn body(self) -> String {
        let (_, code, message) = self.parts();
        format!(r#"{{"error":{{"code":"{code}","message":"{message}"}}}}"#)
    }

    /// The whole HTTP answer: status line, headers and the error body, then the connection closes.
    pub(super) fn response(self) -> Vec<u8> {
        let (status, _, _) = self.parts();
        let body = self.body();
        let retry = if self == Refusal::Capacity { "retry-after: 1\r\n" } else { "" };
        format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}connection: close\r\n\r\n{body}", body.len()).into_bytes()
    }
}

impl ConnectionCounts {
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Takes a slot for a connection from `ip`, or says why there is none.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr, max_connections: usize, max_per_ip: usize) -> Result<ConnectionSlot, Refusal> {
        if self.open.fetch_add(1, Ordering::Relaxed) >= max_connections {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return Err(Refusal::Capacity);
        }
        if max_per_ip == 0 {
            return Ok(ConnectionSlot { counts: self.clone(), ip: None, in_all: true });
        }
        self.admit_per_ip(ip, max_per_ip, true).inspect_err(|_| {
            self.open.fetch_sub(1, Ordering::Relaxed);
        })
    }

    /// Takes a slot for the client a trusted proxy names (`http::forwarded`), counted per IP only.
    pub(super) fn admit_forwarded(self: &Arc<Self>, ip: IpAddr, max_per_ip: usize) -> Result<ConnectionSlot, Refusal> {
        self.admit_per_ip(ip, max_per_ip, false)
    }

    fn admit_per_ip(self: &Arc<Self>, ip: IpAddr, max_per_ip: usize, in_all: bool) -> Result<ConnectionSlot, Refusal> {
        let mut per_ip = self.per_ip.lock().unwrap_or_else(|e| e.into_inner());
        let n = per_ip.entry(ip).or_insert(0);
        if *n >= max_per_ip {
            return Err(Refusal::PerIp);
        }
        *n += 1;
        Ok(ConnectionSlot { counts: self.clone(), ip: Some(ip), in_all })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_reason_is_one_exported_at_zero() {
        for refusal in [Refusal::Capacity, Refusal::PerIp] {
            assert!(crate::core::metrics::CONNECTION_REFUSALS.contains(&refusal.label()), "{refusal:?}");
        }
    }

    #[test]
    fn slots_are_counted_in_all_and_per_ip_and_released_on_drop() {
        let counts = Arc::new(ConnectionCounts::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = counts.admit(a, 3, 2).unwrap();
        let _a2 = counts.admit(a, 3, 2).unwrap();
        assert_eq!(counts.admit(a, 3, 2).err(), Some(Refusal::PerIp));
        let _b1 = counts.admit(b, 3, 2).unwrap();
        assert_eq!(counts.admit(b, 3, 2).err(), Some(Refusal::Capacity));
        assert_eq!(counts.open(), 3);
        drop(a1);
        assert_eq!(counts.open(), 2);
        let _a3 = counts.admit(a, 3, 2).expect("a's slot came back");
        assert_eq!(counts.admit(b, 3, 2).err(), Some(Refusal::Capacity), "refusals took no slot");
    }

    #[test]
    fn a_forwarded_clients_slot_counts_per_ip_only() {
        let counts = Arc::new(ConnectionCounts::default());
        let client: IpAddr = "203.0.113.9".parse().unwrap();
        let first = counts.admit_forwarded(client, 2).unwrap();
        let _second = counts.admit_forwarded(client, 2).unwrap();
        assert_eq!(counts.admit_forwarded(client, 2).err(), Some(Refusal::PerIp));
        assert_eq!(counts.open(), 0, "the proxy's connection holds the slot in all");
        drop(first);
        assert!(counts.admit_forwarded(client, 2).is_ok(), "given back on drop");
    }

    #[test]
    fn without_a_per_ip_limit_nothing_is_kept_per_ip() {
        let counts = Arc::new(ConnectionCounts::default());
        let slots: Vec<_> = (0..100).map(|_| counts.admit("10.0.0.1".parse().unwrap(), usize::MAX, 0).unwrap()).collect();
        assert!(counts.per_ip.lock().unwrap().is_empty());
        assert_eq!(counts.open(), 100);
        drop(slots);
        assert_eq!(counts.open(), 0);
    }

    #[test]
    fn refusals_are_complete_http_answers_with_the_error_body() {
        let text = String::from_utf8(Refusal::Capacity.response()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "unavailable");
        let text = String::from_utf8(Refusal::PerIp.response()).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 ") && text.contains("limit_exceeded"));
    }
}
