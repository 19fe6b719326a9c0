//! Origins and hosts as `server.allowed_origins`, `server.allowed_hosts`, `server.public_url` and
//! `cluster.peers` name them, and as browsers send them (`Origin`, `Host`): parsed here, where the
//! configuration is checked, and compared by the HTTP edge's exposure checks (`http::exposure`).

/// An origin as browsers send it, normalized: lower case, the default port filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

/// Splits `host[:port]` (IPv6 in brackets); the host is lower-cased. `None` when malformed.
pub fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    let authority = authority.trim();
    if authority.is_empty() || authority.contains(['/', '@', ' ', '?', '#']) {
        return None;
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse().ok()?),
        };
        (format!("[{}]", inside.to_ascii_lowercase()), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_ascii_lowercase(), Some(port.parse().ok()?)),
            None => (authority.to_ascii_lowercase(), None),
        }
    };
    (!host.is_empty()).then_some((host, port))
}

/// `scheme://host[:port]`, the port left out when it is the scheme's default.
impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match default_port(&self.scheme) {
            Some(port) if port == self.port => write!(f, "{}://{}", self.scheme, self.host),
            _ => write!(f, "{}://{}:{}", self.scheme, self.host, self.port),
        }
    }
}

/// Parses `scheme://host[:port]` (no path). `None` for anything else, `null` included.
pub fn parse_origin(text: &str) -> Option<Origin> {
    let (scheme, authority) = text.trim().split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let (host, port) = split_host_port(authority.strip_suffix('/').unwrap_or(authority))?;
    let port = port.or_else(|| default_port(&scheme))?;
    Some(Origin { scheme, host, port })
}
