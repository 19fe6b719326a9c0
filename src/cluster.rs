//! The other instances of a cluster (`cluster.peers`) and which of them are healthy, for
//! `GET /session/recommend`. Each peer's `/readyz` is probed every `cluster.probe_interval_ms`
//! with one GET (`http::fetch`: http://, or https:// verified against `cluster.ca_file`); its
//! answer also names the peer's instance id. Readiness, not liveness: a peer whose offset store or backend
//! fails, or that is shutting down, still answers `/healthz` but must get no clients.

use std::sync::{Arc, Mutex};
use std::time::Duration;

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
}

pub struct Cluster {
    this: Instance,
    peers: Mutex<Vec<Peer>>,
    /// `cluster.ca_file`: the authorities https:// peers are verified against.
    ca_file: String,
}

impl Cluster {
    pub fn new(this: Instance, peer_urls: &[String], ca_file: &str) -> Self {
        let peers = peer_urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .filter(|u| *u != this.http_url.trim_end_matches('/'))
            .map(|url| Peer { url, healthy_as: None })
            .collect::<Vec<_>>();
        Self { this, peers: Mutex::new(peers), ca_file: ca_file.to_string() }
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

    /// Probes every peer once, all at once (one that answers nothing must not delay the others'
    /// health), and records the answers.
    pub async fn probe_peers(&self, timeout: Duration) {
        let urls: Vec<String> = self.peers.lock().unwrap().iter().map(|p| p.url.clone()).collect();
        let answers = futures_util::future::join_all(urls.iter().map(|url| probe(url, &self.ca_file, timeout))).await;
        let mut peers = self.peers.lock().unwrap();
        for (url, answer) in urls.into_iter().zip(answers) {
            if let Some(peer) = peers.iter_mut().find(|p| p.url == url) {
                if peer.healthy_as.is_some() != answer.is_some() {
                    match &answer {
                        Some(instance) => tracing::info!(peer = %url, %instance, "peer healthy"),
                        None => tracing::warn!(peer = %url, "peer unhealthy; not recommended until it answers"),
                    }
                }
                peer.healthy_as = answer;
            }
        }
    }
}

/// A group lives where rendezvous hashing on its name points (`/session/recommend?group=`).
pub struct ClusterGroupHome {
    pub cluster: std::sync::Arc<Cluster>,
    /// False while this instance drains: its groups move with their members.
    pub available: Box<dyn Fn() -> bool + Send + Sync>,
}

impl crate::core::group::GroupHome for ClusterGroupHome {
    fn elsewhere(&self, group: &crate::core::names::GroupName) -> Option<(String, String)> {
        let chosen = self.cluster.recommend(group.as_str(), (self.available)());
        (chosen != self.cluster.this).then(|| (chosen.instance.clone(), chosen.ws_url()))
    }
}

/// `GET <url>/readyz`; the peer's instance id when it answers 200 (ready) with one.
async fn probe(url: &str, ca_file: &str, timeout: Duration) -> Option<String> {
    let body =
        crate::http::fetch::get(&format!("{url}/readyz"), ca_file, timeout).await.map_err(|e| tracing::debug!(peer = %url, error = %e, "probe failed")).ok()?;
    let readiness: serde_json::Value = serde_json::from_slice(&body).ok()?;
    readiness["instance"].as_str().map(str::to_string)
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
            // Names are URL-safe as they are (`[A-Za-z0-9._:@-]`).
            let url = format!("{url}/admin/offsets?topic={topic}&client_id={client_id}");
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
