//! The other instances of a cluster (`cluster.peers`) and which of them are healthy, for
//! `GET /session/recommend`. Each peer's `/readyz` is probed every `cluster.probe_interval_ms`
//! with one GET (`http::fetch`: http://, or https:// verified against `cluster.ca_file`); its
//! answer also names the peer's instance id. Readiness, not liveness: a peer whose offset store or backend
//! fails, or that is shutting down, still answers `/healthz` but must get no clients.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::names::{ClientId, TopicName};
use crate::core::peer_offsets::{newest, PeerOffsets, PeerRecords};
use crate::core::protocol::ResumeOffset;
use crate::core::rendezvous;

/// One instance a client may be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub instance: String,
    /// Its `public_url`, e.g. `http://10.0.0.7:8080`.
    pub http_url: String,
}

impl Instance {
    /// The full URL of its `/ws`, without query.
    pub fn ws_url(&self) -> String {
        let base = self.http_url.trim_end_matches('/');
        let base =
            base.strip_prefix("https://").map(|rest| format!("wss://{rest}")).or_else(|| base.strip_prefix("http://").map(|rest| format!("ws://{rest}")));
        format!("{}/ws", base.unwrap_or_else(|| self.http_url.clone()))
    }
}

struct Peer {
    url: String,
    /// The instance id from its last good probe; `None` while it has not answered.
    healthy_as: Option<String>,
    /// The instance id and time of its last good probe, kept while it fails: the groups that
    /// live there stay there for `cluster.group_move_after_ms` (`group_home`). Cleared when it
    /// answers that it drains or shuts down: its groups move at once, and stay moved after it
    /// exits (until it answers ready again).
    last_ready: Option<(String, Instant)>,
}

/// What one probe of a peer's `/readyz` found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Probe {
    Ready(String),
    /// Answered 503 with `shutting_down` (draining or stopping).
    Leaving,
    /// No answer in time, or not ready for another reason (its store or backend failing): it
    /// may still run its groups.
    Silent,
}

pub struct Cluster {
    this: Instance,
    peers: Mutex<Vec<Peer>>,
    /// `cluster.ca_file`: the authorities https:// peers are verified against.
    ca_file: String,
    /// `cluster.group_move_after_ms`.
    group_move_after: Duration,
}

impl Cluster {
    pub fn new(this: Instance, peer_urls: &[String], ca_file: &str, group_move_after: Duration) -> Self {
        let peers = peer_urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .filter(|u| *u != this.http_url.trim_end_matches('/'))
            .map(|url| Peer { url, healthy_as: None, last_ready: None })
            .collect::<Vec<_>>();
        Self { this, peers: Mutex::new(peers), ca_file: ca_file.to_string(), group_move_after }
    }

    /// Each peer's URL, with its instance id when a probe has read one.
    pub fn peers(&self) -> Vec<(String, Option<String>)> {
        self.peers.lock().unwrap().iter().map(|p| (p.url.clone(), p.healthy_as.clone())).collect()
    }

    /// `cluster.ca_file`: what a request to an https:// peer is verified against.
    pub fn ca_file(&self) -> &str {
        &self.ca_file
    }

    pub fn has_peers(&self) -> bool {
        !self.peers.lock().unwrap().is_empty()
    }

    /// The instance `client_id` should use: rendezvous hashing over this instance and the peers
    /// whose last probe succeeded.
    /// The instance `client_id` should use: rendezvous hashing over the healthy peers and this
    /// instance, unless it is draining (`this_available` false; then it is named only when no
    /// peer is healthy).
    pub fn recommend(&self, client_id: &str, this_available: bool) -> Instance {
        let mut healthy = if this_available { vec![self.this.clone()] } else { Vec::new() };
        healthy.extend(
            self.peers
                .lock()
                .unwrap()
                .iter()
                .filter_map(|p| p.healthy_as.as_ref().map(|instance| Instance { instance: instance.clone(), http_url: p.url.clone() })),
        );
        rendezvous::pick(client_id, &healthy, |i| &i.http_url).cloned().unwrap_or_else(|| self.this.clone())
    }

    /// The instance a shared subscription lives on: as `recommend`, but a peer that stopped
    /// answering (or answers not ready without leaving) counts for `cluster.group_move_after_ms`
    /// after its last good probe. A group is where its hub runs, and a missed probe says nothing
    /// of that hub: moved at once, the group would run on two instances (issue 59, item 3).
    pub fn group_home(&self, group: &str, this_available: bool) -> Instance {
        let mut candidates = if this_available { vec![self.this.clone()] } else { Vec::new() };
        candidates.extend(self.group_peers());
        rendezvous::pick(group, &candidates, |i| &i.http_url).cloned().unwrap_or_else(|| self.this.clone())
    }

    /// The peers that may run groups: ready, or silent for less than
    /// `cluster.group_move_after_ms` since their last good probe.
    pub fn group_peers(&self) -> Vec<Instance> {
        self.peers
            .lock()
            .unwrap()
            .iter()
            .filter_map(|p| {
                let (instance, at) = p.last_ready.as_ref()?;
                let counts = p.healthy_as.is_some() || at.elapsed() < self.group_move_after;
                counts.then(|| Instance { instance: instance.clone(), http_url: p.url.clone() })
            })
            .collect()
    }

    /// Probes every peer once, all at once (one that answers nothing must not delay the others'
    /// health), and records the answers.
    pub async fn probe_peers(&self, timeout: Duration) {
        let urls: Vec<String> = self.peers.lock().unwrap().iter().map(|p| p.url.clone()).collect();
        let answers = futures_util::future::join_all(urls.iter().map(|url| probe(url, &self.ca_file, timeout))).await;
        for (url, probed) in urls.into_iter().zip(answers) {
            self.record(&url, probed);
        }
    }

    /// Records what a probe of the peer at `url` found.
    fn record(&self, url: &str, probed: Probe) {
        let mut peers = self.peers.lock().unwrap();
        let Some(peer) = peers.iter_mut().find(|p| p.url == url) else { return };
        let answer = match probed {
            Probe::Ready(instance) => {
                peer.last_ready = Some((instance.clone(), Instant::now()));
                Some(instance)
            }
            Probe::Leaving => {
                peer.last_ready = None;
                None
            }
            Probe::Silent => None,
        };
        if peer.healthy_as.is_some() != answer.is_some() {
            match &answer {
                Some(instance) => tracing::info!(peer = %url, %instance, "peer healthy"),
                None => tracing::warn!(peer = %url, "peer unhealthy; not recommended until it answers"),
            }
        }
        peer.healthy_as = answer;
    }
}

/// A group lives where rendezvous hashing on its name points (`/session/recommend?group=`).
pub struct ClusterGroupHome {
    pub cluster: std::sync::Arc<Cluster>,
    /// False while this instance drains: its groups move with their members.
    pub available: Box<dyn Fn() -> bool + Send + Sync>,
    /// `auth.admin_token`, which the peers share: `live_at_peers` reads their `/admin/groups`.
    pub admin_token: String,
}

#[async_trait::async_trait]
impl crate::core::group::GroupHome for ClusterGroupHome {
    fn elsewhere(&self, group: &crate::core::names::GroupName) -> Option<(String, String)> {
        let chosen = self.cluster.group_home(group.as_str(), (self.available)());
        (chosen != self.cluster.this).then(|| (chosen.instance.clone(), chosen.ws_url()))
    }

    async fn live_at_peers(&self, topic: &TopicName, group: &crate::core::names::GroupName) -> Vec<String> {
        // Only those that may run groups: a peer gone (or leaving) for longer runs none, and
        // asking it would hold every group's start for the request's timeout.
        let peers: Vec<(String, String)> = self.cluster.group_peers().into_iter().map(|p| (p.http_url, p.instance)).collect();
        let asked = peers.iter().map(|(url, _)| {
            let url = format!("{url}/admin/groups?topic={topic}&group={group}");
            let (ca_file, token) = (self.cluster.ca_file(), self.admin_token.as_str());
            async move { crate::http::fetch::get_admin(&url, ca_file, PEER_RECORDS_TIMEOUT, token).await }
        });
        let answers = futures_util::future::join_all(asked).await;
        let mut live = Vec::new();
        for ((url, _), answer) in peers.into_iter().zip(answers) {
            match answer.map(|body| serde_json::from_slice::<serde_json::Value>(&body)) {
                Ok(Ok(list)) if list["groups"].as_array().is_some_and(|groups| !groups.is_empty()) => live.push(url),
                Ok(_) => {}
                // A peer that does not answer is not waited for: the group's home counts it for
                // `cluster.group_move_after_ms` after its last good probe, so a group moves
                // away from one only when it has been silent that long.
                Err(e) => tracing::warn!(peer = %url, %topic, %group, error = %e, "a peer did not answer whether a shared subscription runs there"),
            }
        }
        live
    }
}

/// `GET <url>/readyz`: ready with the peer's instance id when it answers 200 with one.
async fn probe(url: &str, ca_file: &str, timeout: Duration) -> Probe {
    let (status, body) = match crate::http::fetch::get_any(&format!("{url}/readyz"), ca_file, timeout).await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::debug!(peer = %url, error = %e, "probe failed");
            return Probe::Silent;
        }
    };
    let readiness: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    match (status, readiness["instance"].as_str()) {
        (200, Some(instance)) => Probe::Ready(instance.to_string()),
        (503, _) if readiness["shutting_down"] == true => Probe::Leaving,
        _ => Probe::Silent,
    }
}

/// How long a subscribe waits for a peer's records of its client.
const PEER_RECORDS_TIMEOUT: Duration = Duration::from_secs(2);

/// A client's records at the peers (`core::peer_offsets`), read from each peer's
/// `GET /admin/offsets?topic=&client_id=` with the admin token (the peers share it).
pub struct ClusterPeerOffsets {
    pub cluster: Arc<Cluster>,
    pub admin_token: String,
}

#[async_trait::async_trait]
impl PeerOffsets for ClusterPeerOffsets {
    async fn client_records(&self, topic: &TopicName, client_id: &ClientId) -> PeerRecords {
        let peers = self.cluster.peers();
        let asked = peers.iter().map(|(url, _)| {
            // Names are URL-safe as they are (`[A-Za-z0-9._:@-]`); a group's identity is asked
            // for by the group's name.
            let url = match client_id.group() {
                Some(group) => format!("{url}/admin/offsets?topic={topic}&group={group}"),
                None => format!("{url}/admin/offsets?topic={topic}&client_id={client_id}"),
            };
            let (ca_file, token) = (self.cluster.ca_file(), self.admin_token.as_str());
            async move { crate::http::fetch::get_admin(&url, ca_file, PEER_RECORDS_TIMEOUT, token).await.and_then(|body| records_of(&url, &body)) }
        });
        let answers = futures_util::future::join_all(asked).await;
        let mut found = Vec::new();
        let mut unanswered = Vec::new();
        for ((url, _), answer) in peers.iter().zip(answers) {
            match answer {
                Ok(records) => found.extend(records),
                Err(e) => {
                    tracing::warn!(peer = %url, %topic, %client_id, error = %e, "a peer did not answer for a client's records; what it holds is not used");
                    unanswered.push(url.clone());
                }
            }
        }
        PeerRecords { offsets: newest(found), unanswered }
    }
}

/// The rows of an offsets list as (partition, committed offset and its epoch); a row of a peer
/// that names no epoch is of epoch 0 (the oldest: a record of any lowering since fences it).
fn records_of(url: &str, body: &[u8]) -> Result<Vec<(u32, ResumeOffset)>, String> {
    let answer: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("GET {url}: {e}"))?;
    let rows = answer["offsets"].as_array().ok_or_else(|| format!("GET {url}: no offsets list"))?;
    rows.iter()
        .map(|row| {
            let partition = row["partition"].as_u64().and_then(|p| u32::try_from(p).ok());
            let committed = row["committed"].as_u64();
            match (partition, committed) {
                (Some(partition), Some(offset)) => Ok((partition, ResumeOffset { offset, epoch: row["epoch"].as_u64().unwrap_or(0) })),
                _ => Err(format!("GET {url}: a row without partition or committed: {row}")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(group_move_after: Duration) -> Cluster {
        let this = Instance { instance: "a".into(), http_url: "http://a".into() };
        Cluster::new(this, &["http://b".into()], "", group_move_after)
    }

    /// A group name whose rendezvous pick between a and b is b.
    fn group_of_b(c: &Cluster) -> String {
        (0..100).map(|i| format!("g{i}")).find(|g| c.group_home(g, true).instance == "b").expect("some group lives on b")
    }

    #[test]
    fn a_silent_peer_keeps_its_groups_for_a_while_and_a_leaving_one_gives_them_up_at_once() {
        let c = cluster(Duration::from_secs(3600));
        c.record("http://b", Probe::Ready("b".into()));
        let group = group_of_b(&c);
        c.record("http://b", Probe::Silent);
        assert_eq!(c.recommend(&group, true).instance, "a", "clients move at once");
        assert_eq!(c.group_home(&group, true).instance, "b", "a missed probe moves no group");
        c.record("http://b", Probe::Leaving);
        assert_eq!(c.group_home(&group, true).instance, "a", "a draining peer gives its groups up");
        c.record("http://b", Probe::Silent);
        assert_eq!(c.group_home(&group, true).instance, "a", "and they stay moved once it has exited");
        c.record("http://b", Probe::Ready("b".into()));
        assert_eq!(c.group_home(&group, true).instance, "b", "back and ready, it is their home again");
        let soon = cluster(Duration::ZERO);
        soon.record("http://b", Probe::Ready("b".into()));
        soon.record("http://b", Probe::Silent);
        assert_eq!(soon.group_home(&group, true).instance, "a", "silent for longer than cluster.group_move_after_ms");
    }
}
