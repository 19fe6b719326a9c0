//! What one session is allowed to do, as its credentials say (today: a JWT's `exp` and `topics`
//! claims; decoding lives at the HTTP edge). No credentials configured means no limits.

use super::names::ClientId;

/// A session's permissions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// Epoch ms when the credentials expire; the session is closed with 4004 then, unless a
    /// `refresh` replaced them (`refresh_needed` warns `auth.refresh_before_secs` before).
    pub expires_at_ms: Option<u64>,
    /// Topic patterns the session may subscribe to (`orders`, or `orders.*` as a prefix
    /// wildcard); `None` allows every topic.
    pub topics: Option<Vec<String>>,
    /// Topic patterns the session may publish to with `publish` frames (a JWT's `publish`
    /// claim); `None` allows every topic (no credentials configured at all).
    pub publish: Option<Vec<String>>,
    /// Shared-subscription group patterns the session may join (a JWT's `groups` claim, absent:
    /// none); `None` allows every group (no credentials configured at all).
    pub groups: Option<Vec<String>>,
}

/// Checks a token a live session presents to replace its own (`refresh`): decoding lives at the
/// HTTP edge, as for the handshake's.
pub trait TokenCheck: Send + Sync {
    /// The access `token` gives `client_id`, or why it gives none.
    fn check(&self, token: &str, client_id: &ClientId) -> Result<Access, String>;
}

impl Access {
    pub fn allows(&self, topic: &str) -> bool {
        matches_any(self.topics.as_deref(), topic)
    }

    pub fn may_publish(&self, topic: &str) -> bool {
        matches_any(self.publish.as_deref(), topic)
    }

    pub fn may_join(&self, group: &str) -> bool {
        matches_any(self.groups.as_deref(), group)
    }
}

fn matches_any(patterns: Option<&[String]>, topic: &str) -> bool {
    match patterns {
        None => true,
        Some(patterns) => patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => topic.starts_with(prefix),
            None => p == topic,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_exactly_or_by_prefix_with_a_star() {
        let access = Access { topics: Some(vec!["orders".into(), "audit.*".into()]), ..Default::default() };
        assert!(access.allows("orders"));
        assert!(!access.allows("orders2"));
        assert!(access.allows("audit.eu"));
        assert!(!access.allows("audit"));
        assert!(!access.allows("payments"));
        assert!(Access::default().allows("anything"));
        assert!(!Access { topics: Some(vec![]), ..Default::default() }.allows("orders"));
        assert!(Access { topics: Some(vec!["*".into()]), ..Default::default() }.allows("x"));
    }
}
