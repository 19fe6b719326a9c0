//! Typed RocketMQ requests on top of `remoting`: name server lookups, topic admin, send, pull,
//! pop, ack and invisible-time changes. Everything here is one request and its answer; policy
//! (cursors, receipt handles, when to ack) lives in `mod.rs` and `pop.rs`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::message::{decode_messages, Decoded};
use super::remoting::{code, response, Remoting, RemotingError, Response};
use crate::core::backend::BackendError;
use crate::core::clock::{Clock, SystemClock};

/// How long a queue whose long-polling PULL went unanswered is read without the broker's long
/// poll (`Broker::pull`).
const LONG_POLL_SHUNNED_FOR: Duration = Duration::from_secs(60);

/// One queue's long poll of one kind: (request, broker address, topic, queue id).
type LongPolled = (&'static str, String, String, u32);

/// One master broker's share of a topic, as the name server routes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedBroker {
    pub name: String,
    /// `None` while its master is away.
    pub addr: Option<String>,
    pub queues: u32,
}

/// What a SEND answered.
#[derive(Debug, Clone)]
pub struct Sent {
    pub queue_offset: u64,
    /// The broker's message id: its store address and the message's commit log offset, in hex.
    pub msg_id: String,
}

impl Sent {
    /// The commit log offset inside `msg_id` (its last 16 hex digits, after the store address).
    pub fn commit_log_offset(&self) -> Option<u64> {
        let hex = self.msg_id.get(self.msg_id.len().checked_sub(16)?..)?;
        u64::from_str_radix(hex, 16).ok()
    }
}

/// What LITE_SUBSCRIPTION_CTL does with a client's lite subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiteAction {
    Add,
    /// The client's whole subscription becomes these lite topics.
    Replace,
    Remove,
}

/// One PULL answer.
#[derive(Debug)]
pub enum Pulled {
    /// Every message of the answer, decoded or not (`message::decode_messages`).
    Found { messages: Vec<Decoded>, next: u64 },
    /// Nothing at `offset` yet (or a rewind inside the queue): read again from `next`.
    NotFound { next: u64 },
    /// `offset` is outside the queue: read from `next` (the broker's suggestion).
    OffsetMoved { next: u64 },
}

/// What a POP answer says about its receipt handles (RocketMQ's pop response header).
#[derive(Debug, Clone)]
pub struct PopHeader {
    pub pop_time: u64,
    pub invisible_time: u64,
    pub revive_qid: i64,
    /// `retry marker @ queue id` -> checkpoint start offset.
    pub start_offsets: std::collections::HashMap<String, i64>,
}

pub struct Broker {
    pub remoting: Remoting,
    /// Queues whose long poll (PULL or POP) the broker left unanswered for a whole timeout, and
    /// when: read without the broker's long poll for a while (`pull`, `pop`).
    unanswered_long_polls: std::sync::Mutex<HashMap<LongPolled, Instant>>,
    /// Each broker's clock as its last POP answer showed it (`popTime`) and when that POP was
    /// sent: a POP's `bornTime` is read from it (`broker_now_ms`).
    broker_clocks: std::sync::Mutex<HashMap<String, (u64, Instant)>>,
    /// Name servers, as `rocketmq.namesrv_addr` lists them (`;`-separated, as Apache's clients
    /// take them): each knows every broker, so any one answers.
    namesrvs: Vec<String>,
    /// The one that answered last: asked first.
    namesrv_in_use: std::sync::atomic::AtomicUsize,
    pub timeout: Duration,
}

/// The name servers of a `rocketmq.namesrv_addr` value: `;`-separated, blanks ignored.
pub fn namesrv_list(value: &str) -> Vec<String> {
    value.split(';').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect()
}

fn unavailable(e: RemotingError) -> BackendError {
    BackendError::Unavailable(format!("RocketMQ: {e}"))
}

/// An error answer as a backend error.
fn refused(what: &str, r: &Response) -> BackendError {
    match r.code {
        response::TOPIC_NOT_EXIST => BackendError::UnknownTopic(format!("{what}: {}", r.remark)),
        _ => BackendError::Unavailable(format!("RocketMQ {what}: code {} {}", r.code, r.remark)),
    }
}

impl Broker {
    pub fn new(namesrv: String, timeout: Duration) -> Self {
        Self {
            remoting: Remoting::default(),
            unanswered_long_polls: Default::default(),
            broker_clocks: Default::default(),
            namesrvs: namesrv_list(&namesrv),
            namesrv_in_use: Default::default(),
            timeout,
        }
    }

    /// A request to the name servers: the one that answered last first, then the others in
    /// turn while they cannot be reached.
    async fn call_namesrv(&self, code: i32, ext: &[(&str, String)], body: &[u8], timeout: Duration) -> Result<Response, BackendError> {
        use std::sync::atomic::Ordering;
        let count = self.namesrvs.len();
        let first = self.namesrv_in_use.load(Ordering::Relaxed);
        let mut last_error = BackendError::Unavailable("rocketmq.namesrv_addr names no name server".into());
        for i in 0..count {
            let at = (first + i) % count;
            match self.call(&self.namesrvs[at], code, ext, body, timeout).await {
                Ok(r) => {
                    self.namesrv_in_use.store(at, Ordering::Relaxed);
                    return Ok(r);
                }
                Err(e) => {
                    if count > 1 {
                        tracing::warn!(namesrv = %self.namesrvs[at], error = %e, "RocketMQ name server unreachable; trying the next");
                    }
                    last_error = e;
                }
            }
        }
        Err(last_error)
    }

    async fn call(&self, addr: &str, code: i32, ext: &[(&str, String)], body: &[u8], timeout: Duration) -> Result<Response, BackendError> {
        self.remoting.call(addr, code, ext, body, timeout).await.map_err(unavailable)
    }

    /// Whether the master `name` at `addr` answers a request within `timeout`, whatever the
    /// answer: the log end of queue 0 of the topic every broker registers under its own name, a
    /// read that changes nothing and costs the broker a few milliseconds (its runtime info took
    /// rocketmq-rust 250-550 ms, too much to ask every second).
    pub async fn answers(&self, name: &str, addr: &str, timeout: Duration) -> bool {
        self.call(addr, code::GET_MAX_OFFSET, &[("topic", name.to_string()), ("queueId", "0".to_string())], &[], timeout).await.is_ok()
    }

    /// Every topic name the name server knows (system topics and cluster names included).
    pub async fn topic_names(&self) -> Result<Vec<String>, BackendError> {
        let r = self.call_namesrv(code::GET_ALL_TOPIC_LIST_FROM_NAMESERVER, &[], &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("topic list", &r));
        }
        let body: serde_json::Value = parse_json(&r.body)?;
        Ok(body["topicList"].as_array().map(|a| a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect()).unwrap_or_default())
    }

    /// Every broker holding queues of `topic` (any order), `None` when the name server does not
    /// know the topic.
    pub async fn route(&self, topic: &str) -> Result<Option<Vec<RoutedBroker>>, BackendError> {
        let r = self.call_namesrv(code::GET_ROUTEINFO_BY_TOPIC, &[("topic", topic.to_string())], &[], self.timeout).await?;
        if r.code == response::TOPIC_NOT_EXIST {
            return Ok(None);
        }
        if r.code != response::SUCCESS {
            return Err(refused("route", &r));
        }
        let body: serde_json::Value = parse_json(&r.body)?;
        let master_of = |name: &str| {
            body["brokerDatas"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|b| b["brokerName"].as_str() == Some(name))
                .and_then(|b| b["brokerAddrs"]["0"].as_str())
                .map(str::to_string)
        };
        let brokers: Vec<RoutedBroker> = body["queueDatas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|queue| {
                let name = queue["brokerName"].as_str()?.to_string();
                let queues = u32::try_from(queue["readQueueNums"].as_u64()?).ok().filter(|q| *q > 0)?;
                Some(RoutedBroker { addr: master_of(&name), name, queues })
            })
            .collect();
        Ok(Some(brokers))
    }

    /// The master address of every broker the name server knows, by broker name.
    pub async fn brokers(&self) -> Result<Vec<(String, String)>, BackendError> {
        let body = self.cluster_info().await?;
        let mut brokers: Vec<(String, String)> = body["brokerAddrTable"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(name, data)| data["brokerAddrs"]["0"].as_str().map(|a| (name.clone(), a.to_string())))
            .collect();
        brokers.sort();
        Ok(brokers)
    }

    /// Cluster and broker names: the name server lists them among the topics (each broker
    /// registers a topic named after itself and its cluster).
    pub async fn cluster_and_broker_names(&self) -> Result<Vec<String>, BackendError> {
        let body = self.cluster_info().await?;
        let mut names: Vec<String> = body["brokerAddrTable"].as_object().into_iter().flatten().map(|(name, _)| name.clone()).collect();
        names.extend(body["clusterAddrTable"].as_object().into_iter().flatten().map(|(name, _)| name.clone()));
        Ok(names)
    }

    async fn cluster_info(&self) -> Result<serde_json::Value, BackendError> {
        let r = self.call_namesrv(code::GET_BROKER_CLUSTER_INFO, &[], &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("cluster info", &r));
        }
        parse_json(&r.body)
    }

    /// Creates `topic` with `queues` queues; `lite_parent`: as a parent of lite topics
    /// (`message.type=LITE`).
    pub async fn create_topic(&self, broker_addr: &str, topic: &str, queues: u32, lite_parent: bool) -> Result<(), BackendError> {
        let mut ext = vec![
            ("topic", topic.to_string()),
            ("defaultTopic", "TBW102".to_string()),
            ("readQueueNums", queues.to_string()),
            ("writeQueueNums", queues.to_string()),
            ("perm", "6".to_string()),
            ("topicFilterType", "SINGLE_TAG".to_string()),
            ("topicSysFlag", "0".to_string()),
            ("order", "false".to_string()),
        ];
        if lite_parent {
            ext.push(("attributes", "+message.type=LITE".to_string()));
        }
        let r = self.call(broker_addr, code::UPDATE_AND_CREATE_TOPIC, &ext, &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(BackendError::InvalidInput(format!("RocketMQ refused to create {topic}: code {} {}", r.code, r.remark)));
        }
        Ok(())
    }

    /// Creates `topic` with `queues` queues on every master the name server knows, as
    /// `mqadmin updateTopic -c cluster` does (ackgate's own `POST /topics` spreads its partition
    /// count over the masters instead), and returns the masters once the name server routes it
    /// on each. For tests, the loadtest and tools; not used by the gateway.
    pub async fn create_topic_on_every_master(&self, topic: &str, queues: u32, lite_parent: bool) -> Result<Vec<(String, String)>, BackendError> {
        const ROUTED_WITHIN: Duration = Duration::from_secs(30);
        let masters = self.brokers().await?;
        for (_, addr) in &masters {
            self.create_topic(addr, topic, queues, lite_parent).await?;
        }
        let started = std::time::Instant::now();
        while self.route(topic).await?.map_or(0, |route| route.len()) < masters.len() {
            if started.elapsed() > ROUTED_WITHIN {
                return Err(BackendError::Unavailable(format!("{topic} is not routed on all {} masters", masters.len())));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(masters)
    }

    pub async fn delete_topic(&self, broker_addr: &str, topic: &str) -> Result<(), BackendError> {
        let ext = [("topic", topic.to_string())];
        let r = self.call(broker_addr, code::DELETE_TOPIC_IN_BROKER, &ext, &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("delete topic in broker", &r));
        }
        // Each name server keeps its own routes: tell every one. One that cannot be reached now
        // drops the topic at the broker's next registration, which no longer lists it.
        let mut told = None;
        for namesrv in &self.namesrvs {
            let answer = match self.call(namesrv, code::DELETE_TOPIC_IN_NAMESRV, &ext, &[], self.timeout).await {
                Ok(r) if r.code == response::SUCCESS => Ok(()),
                Ok(r) => Err(refused("delete topic in name server", &r)),
                Err(e) => Err(e),
            };
            if let Err(e) = &answer {
                tracing::warn!(%namesrv, topic, error = %e, "deleting a topic at a RocketMQ name server failed");
            }
            told = Some(match told {
                Some(Ok(())) => Ok(()),
                _ => answer,
            });
        }
        told.unwrap_or(Ok(()))
    }

    /// Makes sure the consumer group exists (POP refuses an unknown group). It is never used to
    /// commit an offset.
    pub async fn ensure_group(&self, broker_addr: &str, group: &str) -> Result<(), BackendError> {
        self.create_group(broker_addr, group, serde_json::json!({})).await
    }

    /// Makes sure a consumer group bound to the lite parent `parent` exists (POP_LITE and
    /// LITE_SUBSCRIPTION_CTL refuse any other), with room for one client subscribed to every
    /// lite topic this instance serves and every pending event it may have. `wildcard`: its
    /// clients see every lite topic of the parent (`lite_topic_names`).
    pub async fn ensure_lite_group(&self, broker_addr: &str, group: &str, parent: &str, wildcard: bool) -> Result<(), BackendError> {
        let mut attributes = serde_json::json!({
            "+lite.bind.topic": parent,
            "+lite.sub.client.quota": "100000000",
            "+lite.sub.client.max.event.cnt": "1000000",
        });
        if wildcard {
            // Its presence makes the group a wildcard one.
            attributes["+lite.sub.wildcard"] = serde_json::json!("true");
        }
        self.create_group(broker_addr, group, attributes).await
    }

    async fn create_group(&self, broker_addr: &str, group: &str, attributes: serde_json::Value) -> Result<(), BackendError> {
        let config = serde_json::json!({
            "groupName": group,
            "consumeEnable": true,
            "consumeFromMinEnable": true,
            "consumeBroadcastEnable": false,
            "retryQueueNums": 1,
            "retryMaxTimes": 16,
            "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": false,
            "attributes": attributes,
        });
        let body = serde_json::to_vec(&config).expect("JSON");
        let r = self.call(broker_addr, code::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, &[], &body, self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("create consumer group", &r));
        }
        Ok(())
    }

    /// Sends one message to a queue.
    pub async fn send(
        &self,
        broker_addr: &str,
        producer_group: &str,
        topic: &str,
        queue_id: u32,
        properties: String,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Sent, BackendError> {
        let now = SystemClock.now_ms();
        let ext = [
            ("producerGroup", producer_group.to_string()),
            ("topic", topic.to_string()),
            ("defaultTopic", "TBW102".to_string()),
            ("defaultTopicQueueNums", "4".to_string()),
            ("queueId", queue_id.to_string()),
            ("sysFlag", "0".to_string()),
            ("bornTimestamp", now.to_string()),
            ("flag", "0".to_string()),
            ("properties", properties),
            ("reconsumeTimes", "0".to_string()),
            ("unitMode", "false".to_string()),
            ("batch", "false".to_string()),
        ];
        // A busy broker refuses before storing anything (SYSTEM_BUSY: its flow control), so the
        // send is tried again after a pause, as RocketMQ's producers do, within `timeout`.
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_millis(5);
        let r = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let r = self.call(broker_addr, code::SEND_MESSAGE, &ext, body, left.max(Duration::from_millis(1))).await?;
            if r.code != response::SYSTEM_BUSY || tokio::time::Instant::now() + pause >= deadline {
                break r;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        };
        if r.code != response::SUCCESS {
            return Err(refused("send", &r));
        }
        let offset = r.number("queueOffset").map_err(|e| BackendError::Io(e.to_string()))?;
        let queue_offset = u64::try_from(offset).map_err(|_| BackendError::Io(format!("send answered queue offset {offset}")))?;
        Ok(Sent { queue_offset, msg_id: r.field("msgId").unwrap_or_default().to_string() })
    }

    /// QUERY_MESSAGE by unique key: the messages of `topic` stored on this broker under the
    /// producer's `UNIQ_KEY` (the broker's index), with their queue and queue offset. Empty when
    /// the index has none.
    pub async fn query_by_uniq_key(&self, broker_addr: &str, topic: &str, uniq_key: &str, timeout: Duration) -> Result<Vec<Decoded>, BackendError> {
        let ext = [
            ("topic", topic.to_string()),
            ("key", uniq_key.to_string()),
            ("maxNum", "32".to_string()),
            ("beginTimestamp", "0".to_string()),
            ("endTimestamp", i64::MAX.to_string()),
            // The broker's flag for a lookup by unique key (`_UNIQUE_KEY_QUERY`).
            ("_UNIQUE_KEY_QUERY", "true".to_string()),
        ];
        let r = self.call(broker_addr, code::QUERY_MESSAGE, &ext, &[], timeout).await?;
        match r.code {
            response::SUCCESS => Ok(decode_messages(&r.body)),
            response::QUERY_NOT_FOUND => Ok(Vec::new()),
            _ => Err(refused("query message by unique key", &r)),
        }
    }

    /// VIEW_MESSAGE_BY_ID: the stored message at a commit log offset (with the properties the
    /// store added, such as a lite message's queue offset).
    pub async fn view_message(&self, broker_addr: &str, commit_log_offset: u64) -> Result<Decoded, BackendError> {
        let r = self.call(broker_addr, code::VIEW_MESSAGE_BY_ID, &[("offset", commit_log_offset.to_string())], &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("view message", &r));
        }
        decode_messages(&r.body).into_iter().next().ok_or_else(|| BackendError::Io(format!("view message at {commit_log_offset} answered no message")))
    }

    /// LITE_SUBSCRIPTION_CTL: adds lite topics of `parent` to (or removes them from) `client`'s
    /// subscription in `group`. An add with `from` sets the group's offset of each to it.
    // One argument per field of the request's subscription entry (clippy.toml says why).
    #[allow(clippy::too_many_arguments)]
    pub async fn lite_subscription(
        &self,
        broker_addr: &str,
        action: LiteAction,
        client: &str,
        group: &str,
        parent: &str,
        lites: &[&str],
        from: Option<u64>,
    ) -> Result<(), BackendError> {
        self.lite_subscription_set(broker_addr, vec![subscription_entry(action, client, group, parent, lites, from)]).await
    }

    /// LITE_SUBSCRIPTION_CTL with one add per offset: the lite topics of each set are added to
    /// `client`'s subscription with the group's offset set to that offset. One request however
    /// many lite topics (the broker copies the client's whole subscription per entry, so one add
    /// per lite topic is quadratic in the lite topics read).
    pub async fn lite_resubscribe(&self, broker_addr: &str, client: &str, group: &str, parent: &str, at: &[(u64, Vec<&str>)]) -> Result<(), BackendError> {
        let entries = at.iter().map(|(from, lites)| subscription_entry(LiteAction::Add, client, group, parent, lites, Some(*from))).collect();
        self.lite_subscription_set(broker_addr, entries).await
    }

    /// LITE_SUBSCRIPTION_CTL making `lite` the only lite topic of `client` in `group`, with the
    /// group's offset of it set to `from`: a complete add (which drops what an earlier request
    /// left) sets no offset at the broker, so a partial add with the offset follows in the same
    /// request.
    pub async fn lite_subscribe_only(&self, broker_addr: &str, client: &str, group: &str, parent: &str, lite: &str, from: u64) -> Result<(), BackendError> {
        let entries = vec![
            subscription_entry(LiteAction::Replace, client, group, parent, &[lite], None),
            subscription_entry(LiteAction::Add, client, group, parent, &[lite], Some(from)),
        ];
        self.lite_subscription_set(broker_addr, entries).await
    }

    async fn lite_subscription_set(&self, broker_addr: &str, entries: Vec<serde_json::Value>) -> Result<(), BackendError> {
        let body = serde_json::to_vec(&serde_json::json!({ "subscriptionSet": entries })).expect("JSON");
        let r = self.call(broker_addr, code::LITE_SUBSCRIPTION_CTL, &[], &body, self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("lite subscription", &r));
        }
        Ok(())
    }

    /// Every lite topic of `parent` the broker stores, as GET_LITE_CLIENT_INFO lists them for a
    /// client of a wildcard group. The client needs a subscription (empty will do); the broker
    /// keeps subscriptions in memory only, so it is made again each time.
    pub async fn lite_topic_names(&self, broker_addr: &str, group: &str, client: &str, parent: &str) -> Result<Vec<String>, BackendError> {
        self.lite_subscription(broker_addr, LiteAction::Replace, client, group, parent, &[], None).await?;
        let ext = [("parentTopic", parent.to_string()), ("group", group.to_string()), ("clientId", client.to_string()), ("maxCount", "100000000".to_string())];
        let r = self.call(broker_addr, code::GET_LITE_CLIENT_INFO, &ext, &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("lite client info", &r));
        }
        let body: serde_json::Value = parse_json(&r.body)?;
        Ok(body["liteTopicSet"].as_array().map(|a| a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect()).unwrap_or_default())
    }

    /// TRIGGER_LITE_DISPATCH: the broker looks again at every lite topic `client` subscribes to
    /// in `group` and marks the ones with messages past the group's offset for its next pop (its
    /// own marks are dropped after 30 s or past a per-client count).
    pub async fn trigger_lite_dispatch(&self, broker_addr: &str, group: &str, client: &str) -> Result<(), BackendError> {
        let ext = [("group", group.to_string()), ("clientId", client.to_string())];
        let r = self.call(broker_addr, code::TRIGGER_LITE_DISPATCH, &ext, &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("trigger lite dispatch", &r));
        }
        Ok(())
    }

    /// POP_LITE_MESSAGE: messages of the lite topics of `parent` that `client` subscribes to, from
    /// the group's offset of each (which the pop moves past them); empty after `wait`.
    // One argument per field of the POP_LITE request header (clippy.toml says why).
    #[allow(clippy::too_many_arguments)]
    pub async fn pop_lite(
        &self,
        broker_addr: &str,
        client: &str,
        group: &str,
        parent: &str,
        max: usize,
        invisible: Duration,
        wait: Duration,
    ) -> Result<Vec<Decoded>, BackendError> {
        let sent = Instant::now();
        let ext = [
            ("clientId", client.to_string()),
            ("consumerGroup", group.to_string()),
            ("topic", parent.to_string()),
            ("maxMsgNum", max.clamp(1, 32).to_string()),
            ("invisibleTime", invisible.as_millis().to_string()),
            ("pollTime", wait.as_millis().to_string()),
            ("bornTime", self.broker_now_ms(broker_addr).to_string()),
        ];
        let r = self.call(broker_addr, code::POP_LITE_MESSAGE, &ext, &[], self.timeout + wait).await?;
        self.read_broker_clock(broker_addr, &r, wait, sent);
        match r.code {
            response::SUCCESS => Ok(decode_messages(&r.body)),
            response::PULL_NOT_FOUND | response::POLLING_TIMEOUT | response::POLLING_FULL => Ok(Vec::new()),
            _ => Err(refused("pop lite", &r)),
        }
    }

    /// PULL from `offset`, never committing an offset for `group`. `wait` > 0 lets the broker
    /// hold the request until a message arrives (long polling).
    ///
    /// A long poll the broker leaves unanswered for the whole timeout turns the broker's long poll
    /// off for that queue for `LONG_POLL_SHUNNED_FOR` (`shun_long_poll`): the PULL asks without it
    /// and, finding nothing new, waits `wait` here instead.
    pub async fn pull(
        &self,
        broker_addr: &str,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Pulled, BackendError> {
        const FLAG_SUSPEND: i32 = 0x2;
        const FLAG_SUBSCRIPTION: i32 = 0x4;
        let queue = ("PULL", broker_addr.to_string(), topic.to_string(), queue_id);
        let shunned = !wait.is_zero() && self.long_poll_shunned(&queue);
        let broker_wait = if shunned { Duration::ZERO } else { wait };
        let suspend = if broker_wait.is_zero() { 0 } else { FLAG_SUSPEND };
        let ext = [
            ("consumerGroup", group.to_string()),
            ("topic", topic.to_string()),
            ("queueId", queue_id.to_string()),
            ("queueOffset", offset.to_string()),
            ("maxMsgNums", max.clamp(1, 1024).to_string()),
            // No FLAG_COMMIT_OFFSET: the broker must never hold an offset for this group.
            ("sysFlag", (FLAG_SUBSCRIPTION | suspend).to_string()),
            ("commitOffset", "0".to_string()),
            ("suspendTimeoutMillis", broker_wait.as_millis().to_string()),
            ("subscription", "*".to_string()),
            ("subVersion", "0".to_string()),
            ("expressionType", "TAG".to_string()),
        ];
        let r = self.long_poll(queue, code::PULL_MESSAGE, &ext, broker_wait).await?;
        let next = |r: &Response| r.number("nextBeginOffset").map(|n| n.max(0) as u64).unwrap_or(offset);
        match r.code {
            response::SUCCESS => Ok(Pulled::Found { next: next(&r), messages: decode_messages(&r.body) }),
            response::PULL_NOT_FOUND | response::PULL_RETRY_IMMEDIATELY => {
                if shunned && next(&r) <= offset {
                    tokio::time::sleep(wait).await;
                }
                Ok(Pulled::NotFound { next: next(&r) })
            }
            response::PULL_OFFSET_MOVED => Ok(Pulled::OffsetMoved { next: next(&r) }),
            _ => Err(refused("pull", &r)),
        }
    }

    /// Now by `broker_addr`'s clock, for a POP's `bornTime`: the broker holds a POP until
    /// `bornTime` plus its poll time by its own clock, so one from a gateway whose clock runs
    /// ahead is held that much longer, past the request's timeout, and one from a clock behind by
    /// more than half a second is refused ("polling timeout") before anything is popped. Read
    /// from the broker's last `popTime` and the monotonic time since that POP was sent
    /// (`read_broker_clock`), so steps of this host's wall clock do not move it; this host's
    /// clock until a POP answered.
    fn broker_now_ms(&self, broker_addr: &str) -> u64 {
        match self.broker_clocks.lock().unwrap().get(broker_addr) {
            Some((pop_time, sent)) => pop_time + sent.elapsed().as_millis() as u64,
            None => SystemClock.now_ms(),
        }
    }

    /// Learns the broker's clock from a POP answer sent at `sent` with poll time `poll`. Timed
    /// from the send, not the answer, the estimate can only run ahead of the broker's clock (by
    /// the time the answer took), which the long poll's timeout heals (`shun_long_poll`); timed
    /// from the answer, a pause of this process while an answer was on its way left it behind for
    /// good, every POP refused. A "polling timeout" that comes before its poll time is the broker
    /// calling `bornTime` old (its clock stepped ahead, or this estimate was behind): the estimate
    /// is dropped, and this host's
    /// clock stands in until a POP answers again.
    fn read_broker_clock(&self, broker_addr: &str, r: &Response, poll: Duration, sent: Instant) {
        let pop_time = r.number("popTime").unwrap_or(0).max(0) as u64;
        let mut clocks = self.broker_clocks.lock().unwrap();
        if r.code == response::SUCCESS && pop_time > 0 {
            clocks.insert(broker_addr.to_string(), (pop_time, sent));
        } else if r.code == response::POLLING_TIMEOUT && (poll.is_zero() || sent.elapsed() < poll / 2) {
            clocks.remove(broker_addr);
        }
    }

    /// A request to `queue`'s broker that may be a long poll (`broker_wait` > 0): one left
    /// unanswered for the whole timeout turns that queue's long poll off (`shun_long_poll`).
    async fn long_poll(&self, queue: LongPolled, code: i32, ext: &[(&str, String)], broker_wait: Duration) -> Result<Response, BackendError> {
        self.remoting.call(&queue.1, code, ext, &[], self.timeout + broker_wait).await.map_err(|e| {
            if !broker_wait.is_zero() && matches!(e, RemotingError::Timeout { .. }) {
                self.shun_long_poll(queue);
            }
            unavailable(e)
        })
    }

    /// Whether `queue`'s long poll is off (`shun_long_poll`); forgets it once the time is up.
    fn long_poll_shunned(&self, queue: &LongPolled) -> bool {
        let mut shunned = self.unanswered_long_polls.lock().unwrap();
        match shunned.get(queue) {
            Some(since) if since.elapsed() < LONG_POLL_SHUNNED_FOR => true,
            Some(_) => {
                shunned.remove(queue);
                tracing::info!(request = queue.0, broker = %queue.1, topic = %queue.2, queue = queue.3, "long polling on again for this queue");
                false
            }
            None => false,
        }
    }

    /// A long poll the broker left unanswered for the whole timeout. rocketmq-rust holds a POP
    /// until the request's `bornTime` plus its poll time by the broker's clock: a gateway whose
    /// clock ran ahead of the broker's by more than the request timeout had every POP of a queue
    /// with nothing new time out (the fault suite's clock steps on RocketMQ, before `bornTime`
    /// came from `broker_now_ms`: that gateway's clients got no more events once the publishers
    /// stopped). Whatever the cause, without the long poll the broker answers at once.
    fn shun_long_poll(&self, queue: LongPolled) {
        tracing::warn!(
            request = queue.0, broker = %queue.1, topic = %queue.2, queue = queue.3, off_for = ?LONG_POLL_SHUNNED_FOR,
            "the broker left a long poll unanswered for the whole request timeout (clocks apart?); reading this queue without the broker's long poll for a while"
        );
        crate::core::metrics::rocketmq_long_polls_unanswered().increment(1);
        let mut shunned = self.unanswered_long_polls.lock().unwrap();
        // Queues nobody reads any more (a deleted topic, a broker gone to a new address) go.
        shunned.retain(|_, since| since.elapsed() < LONG_POLL_SHUNNED_FOR);
        shunned.insert(queue, Instant::now());
    }

    /// POP from one queue (and, as the broker decides, from the group's retry topic).
    pub async fn pop(
        &self,
        broker_addr: &str,
        group: &str,
        topic: &str,
        queue_id: u32,
        max: usize,
        invisible: Duration,
        wait: Duration,
    ) -> Result<(PopHeader, Vec<Decoded>), BackendError> {
        let queue = ("POP", broker_addr.to_string(), topic.to_string(), queue_id);
        if wait.is_zero() || !self.long_poll_shunned(&queue) {
            return self.pop_once(queue, group, max, invisible, wait).await;
        }
        // Without the broker's long poll: asked again after the wait when it had nothing, so an
        // event arriving meanwhile is popped here rather than read by PULL and popped later.
        let first = self.pop_once(queue.clone(), group, max, invisible, Duration::ZERO).await?;
        if !first.1.is_empty() {
            return Ok(first);
        }
        tokio::time::sleep(wait).await;
        self.pop_once(queue, group, max, invisible, Duration::ZERO).await
    }

    /// One POP of `queue` with poll time `poll` (0: no long poll).
    async fn pop_once(
        &self,
        queue: LongPolled,
        group: &str,
        max: usize,
        invisible: Duration,
        poll: Duration,
    ) -> Result<(PopHeader, Vec<Decoded>), BackendError> {
        let broker_addr = queue.1.clone();
        let sent = Instant::now();
        let ext = [
            ("consumerGroup", group.to_string()),
            ("topic", queue.2.clone()),
            ("queueId", queue.3.to_string()),
            ("maxMsgNums", max.clamp(1, 32).to_string()),
            ("invisibleTime", invisible.as_millis().to_string()),
            ("pollTime", poll.as_millis().to_string()),
            ("bornTime", self.broker_now_ms(&broker_addr).to_string()),
            // ConsumeInitMode.MIN: a group's first pop starts at the queue's first message.
            ("initMode", "0".to_string()),
            ("expType", "TAG".to_string()),
            ("exp", "*".to_string()),
            ("order", "false".to_string()),
        ];
        let r = self.long_poll(queue, code::POP_MESSAGE, &ext, poll).await?;
        self.read_broker_clock(&broker_addr, &r, poll, sent);
        let empty = || PopHeader { pop_time: 0, invisible_time: 0, revive_qid: 0, start_offsets: Default::default() };
        match r.code {
            response::SUCCESS => {}
            response::PULL_NOT_FOUND | response::POLLING_TIMEOUT | response::POLLING_FULL => return Ok((empty(), Vec::new())),
            _ => return Err(refused("pop", &r)),
        }
        let header = PopHeader {
            pop_time: r.number("popTime").unwrap_or(0).max(0) as u64,
            invisible_time: r.number("invisibleTime").unwrap_or(0).max(0) as u64,
            revive_qid: r.number("reviveQid").unwrap_or(0),
            start_offsets: parse_start_offsets(r.field("startOffsetInfo").unwrap_or_default()),
        };
        Ok((header, decode_messages(&r.body)))
    }

    /// ACK_MESSAGE for one receipt handle.
    pub async fn ack(&self, broker_addr: &str, group: &str, topic: &str, queue_id: u32, extra_info: &str, offset: u64) -> Result<(), BackendError> {
        let ext = receipt_fields(group, topic, queue_id, extra_info, offset);
        let r = self.call(broker_addr, code::ACK_MESSAGE, &ext, &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("ack", &r));
        }
        Ok(())
    }

    /// CHANGE_MESSAGE_INVISIBLETIME: the message stays invisible `invisible` from now; answers
    /// the new pop time and revive queue (the handle changes with them).
    pub async fn change_invisible_time(
        &self,
        broker_addr: &str,
        group: &str,
        topic: &str,
        queue_id: u32,
        extra_info: &str,
        offset: u64,
        invisible: Duration,
    ) -> Result<(u64, i64), BackendError> {
        let mut ext = receipt_fields(group, topic, queue_id, extra_info, offset);
        ext.push(("invisibleTime", invisible.as_millis().to_string()));
        let r = self.call(broker_addr, code::CHANGE_MESSAGE_INVISIBLETIME, &ext, &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("change invisible time", &r));
        }
        Ok((r.number("popTime").unwrap_or(0).max(0) as u64, r.number("reviveQid").unwrap_or(0)))
    }

    /// First (`GET_MIN_OFFSET`) or next-to-write (`GET_MAX_OFFSET`) offset of a queue.
    pub async fn queue_offset(&self, broker_addr: &str, topic: &str, queue_id: u32, max: bool) -> Result<u64, BackendError> {
        let code = if max { code::GET_MAX_OFFSET } else { code::GET_MIN_OFFSET };
        let r = self.call(broker_addr, code, &[("topic", topic.to_string()), ("queueId", queue_id.to_string())], &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("queue offset", &r));
        }
        Ok(r.number("offset").map_err(|e| BackendError::Io(e.to_string()))?.max(0) as u64)
    }

    /// SEARCH_OFFSET_BY_TIMESTAMP with the lower boundary: the first offset of a queue stored at
    /// or after `time_ms`.
    pub async fn offset_for_time(&self, broker_addr: &str, topic: &str, queue_id: u32, time_ms: u64) -> Result<u64, BackendError> {
        let fields =
            [("topic", topic.to_string()), ("queueId", queue_id.to_string()), ("timestamp", time_ms.to_string()), ("boundaryType", "LOWER".to_string())];
        let r = self.call(broker_addr, code::SEARCH_OFFSET_BY_TIMESTAMP, &fields, &[], self.timeout).await?;
        if r.code != response::SUCCESS {
            return Err(refused("search offset by time", &r));
        }
        Ok(r.number("offset").map_err(|e| BackendError::Io(e.to_string()))?.max(0) as u64)
    }
}

/// The header fields naming one receipt handle (ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME).
fn receipt_fields(group: &str, topic: &str, queue_id: u32, extra_info: &str, offset: u64) -> Vec<(&'static str, String)> {
    vec![
        ("consumerGroup", group.to_string()),
        ("topic", topic.to_string()),
        ("queueId", queue_id.to_string()),
        ("extraInfo", extra_info.to_string()),
        ("offset", offset.to_string()),
    ]
}

/// `marker queueId offset;marker queueId offset` -> `marker@queueId` -> offset.
fn parse_start_offsets(info: &str) -> std::collections::HashMap<String, i64> {
    info.split(';')
        .filter_map(|one| {
            let mut parts = one.split(' ');
            let (marker, queue, offset) = (parts.next()?, parts.next()?, parts.next()?);
            Some((format!("{marker}@{queue}"), offset.parse().ok()?))
        })
        .collect()
}

/// Parses a JSON body, quoting the bare integer map keys Java's fastjson writes (`{0:"addr"}`).
fn parse_json(body: &[u8]) -> Result<serde_json::Value, BackendError> {
    serde_json::from_slice(body)
        .or_else(|_| serde_json::from_slice(&quote_integer_keys(body)))
        .map_err(|e| BackendError::Io(format!("RocketMQ answered a body that is not JSON: {e}")))
}

fn quote_integer_keys(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 16);
    let (mut in_string, mut escaped) = (false, false);
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        out.push(b);
        i += 1;
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b',' => {
                let digits = body[i..].iter().take_while(|c| c.is_ascii_digit() || **c == b'-').count();
                if digits > 0 && body.get(i + digits) == Some(&b':') {
                    out.push(b'"');
                    out.extend_from_slice(&body[i..i + digits]);
                    out.push(b'"');
                    i += digits;
                }
            }
            _ => {}
        }
    }
    out
}

/// One entry of a LITE_SUBSCRIPTION_CTL body; an add with `from` sets the group's offset.
fn subscription_entry(action: LiteAction, client: &str, group: &str, parent: &str, lites: &[&str], from: Option<u64>) -> serde_json::Value {
    let mut entry = serde_json::json!({
        "action": match action {
            LiteAction::Add => "PARTIAL_ADD",
            LiteAction::Replace => "COMPLETE_ADD",
            LiteAction::Remove => "PARTIAL_REMOVE",
        },
        "clientId": client,
        "group": group,
        "topic": parent,
        "liteTopicSet": lites,
        "version": 0,
    });
    if let Some(from) = from {
        entry["offsetOption"] = serde_json::json!({"type": "Offset", "value": from});
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fastjson_integer_keys_are_quoted_outside_strings_only() {
        let body = br#"{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"x,2:y"}}]}"#;
        let v = parse_json(body).unwrap();
        assert_eq!(v["brokerDatas"][0]["brokerAddrs"]["0"], "127.0.0.1:10911");
        assert_eq!(v["brokerDatas"][0]["brokerAddrs"]["1"], "x,2:y");
    }

    /// A fake broker: every request's code and `extFields` go to the returned channel, and
    /// `answer` gives the response's code and `extFields` for it, or `None` to leave it
    /// unanswered. Every connection is served (a request that times out on a connection silent
    /// meanwhile makes the next one open another).
    async fn fake_broker(
        answer: fn(i32, &serde_json::Value) -> Option<(i32, serde_json::Value)>,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<(i32, serde_json::Value)>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut length = [0u8; 4];
                    while socket.read_exact(&mut length).await.is_ok() {
                        let mut frame = vec![0u8; u32::from_be_bytes(length) as usize];
                        socket.read_exact(&mut frame).await.unwrap();
                        let header_len = (u32::from_be_bytes(frame[..4].try_into().unwrap()) & 0x00FF_FFFF) as usize;
                        let header: serde_json::Value = serde_json::from_slice(&frame[4..4 + header_len]).unwrap();
                        let code = header["code"].as_i64().unwrap() as i32;
                        let _ = seen.send((code, header["extFields"].clone()));
                        let Some((answer_code, ext)) = answer(code, &header["extFields"]) else { continue };
                        let answer = serde_json::json!({"code": answer_code, "flag": 1, "opaque": header["opaque"], "extFields": ext});
                        let answer = serde_json::to_vec(&answer).unwrap();
                        let mut out = ((4 + answer.len()) as u32).to_be_bytes().to_vec();
                        out.extend_from_slice(&(answer.len() as u32).to_be_bytes());
                        out.extend_from_slice(&answer);
                        socket.write_all(&out).await.unwrap();
                    }
                });
            }
        });
        (addr, requests)
    }

    fn field(ext: &serde_json::Value, name: &str) -> u64 {
        ext[name].as_str().unwrap().parse().unwrap()
    }

    /// What a gateway's connection to rocketmq-rust saw for minutes in issue 60's RocketMQ runs:
    /// a long poll (PULL with the suspend flag, POP with a poll time) never answered, anything
    /// else answered "nothing new" at once.
    fn no_long_polls(code: i32, ext: &serde_json::Value) -> Option<(i32, serde_json::Value)> {
        let long_poll = match code {
            code::PULL_MESSAGE => field(ext, "sysFlag") & 0x2 != 0,
            _ => field(ext, "pollTime") > 0,
        };
        (!long_poll).then(|| (response::PULL_NOT_FOUND, serde_json::json!({"nextBeginOffset": ext["queueOffset"].as_str().unwrap_or("0")})))
    }

    /// Issue 60's RocketMQ runs: one gateway's long polls went unanswered to the end of the run,
    /// and its clients missed the last events. On the old code every PULL and POP asked for the
    /// long poll again and timed out again.
    #[tokio::test]
    async fn a_long_poll_the_broker_leaves_unanswered_is_not_asked_for_again_on_that_queue() {
        let (addr, mut requests) = fake_broker(no_long_polls).await;
        // Long enough that an answered request is never cut by a busy machine.
        let broker = Broker::new(String::new(), Duration::from_secs(2));
        let wait = Duration::from_millis(200);
        let first = broker.pull(&addr, "g", "t", 0, 5, 10, wait).await;
        assert!(matches!(first, Err(BackendError::Unavailable(_))), "the unanswered long poll fails: {first:?}");
        assert_eq!(field(&requests.recv().await.unwrap().1, "suspendTimeoutMillis"), 200);
        let started = Instant::now();
        let second = broker.pull(&addr, "g", "t", 0, 5, 10, wait).await.expect("answered");
        assert!(matches!(second, Pulled::NotFound { next: 5 }), "{second:?}");
        let (_, ext) = requests.recv().await.unwrap();
        assert_eq!((field(&ext, "sysFlag") & 0x2, field(&ext, "suspendTimeoutMillis")), (0, 0), "asked without the broker's long poll");
        assert!(started.elapsed() >= wait, "nothing new: the wait is spent here instead of at the broker");
        // Another queue, and a POP of the same queue, still ask for the broker's long poll.
        assert!(broker.pull(&addr, "g", "t", 1, 5, 10, wait).await.is_err());
        assert_eq!(field(&requests.recv().await.unwrap().1, "suspendTimeoutMillis"), 200);
        let invisible = Duration::from_secs(30);
        assert!(broker.pop(&addr, "g", "t", 0, 8, invisible, wait).await.is_err());
        assert_eq!(field(&requests.recv().await.unwrap().1, "pollTime"), 200);
        let started = Instant::now();
        let (_, popped) = broker.pop(&addr, "g", "t", 0, 8, invisible, wait).await.expect("answered");
        assert!(popped.is_empty());
        assert_eq!(field(&requests.recv().await.unwrap().1, "pollTime"), 0, "POP asked without the long poll too");
        assert_eq!(field(&requests.recv().await.unwrap().1, "pollTime"), 0, "and asked again after the wait");
        assert!(started.elapsed() >= wait);
    }

    /// A broker whose first answer says a time ten minutes behind this host's clock (an estimate
    /// left behind, as a pause of the gateway while an answer was on its way could leave it; or
    /// a broker clock stepped ahead since) and that, from then on, refuses at once a POP whose
    /// `bornTime` is more than a second behind this host's clock ("polling timeout"), as
    /// rocketmq-rust does with its own clock.
    fn first_answer_behind(_: i32, ext: &serde_json::Value) -> Option<(i32, serde_json::Value)> {
        static ANSWERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let now = SystemClock.now_ms();
        if !ANSWERED.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Some((response::SUCCESS, serde_json::json!({"popTime": (now - 600_000).to_string()})));
        }
        if field(ext, "bornTime") + 1000 < now {
            return Some((response::POLLING_TIMEOUT, serde_json::json!({})));
        }
        Some((response::SUCCESS, serde_json::json!({"popTime": now.to_string()})))
    }

    /// Found by review: an estimate behind the broker's clock got every POP refused for good, and
    /// only a successful POP could move it. A refusal that comes before the poll time drops it.
    #[tokio::test]
    async fn a_clock_estimate_the_broker_refuses_is_dropped_and_learned_again() {
        let (addr, mut requests) = fake_broker(first_answer_behind).await;
        let broker = Broker::new(String::new(), Duration::from_secs(2));
        let pop = || broker.pop(&addr, "g", "t", 0, 8, Duration::from_secs(30), Duration::from_millis(400));
        let born = |ext: serde_json::Value| field(&ext, "bornTime").abs_diff(SystemClock.now_ms());
        pop().await.expect("answered");
        assert!(born(requests.recv().await.unwrap().1) < 60_000, "no answer yet: this host's clock");
        pop().await.expect("answered");
        assert!(born(requests.recv().await.unwrap().1) > 500_000, "the behind estimate, refused");
        pop().await.expect("answered");
        assert!(born(requests.recv().await.unwrap().1) < 60_000, "dropped: this host's clock again, and popped");
        assert!(broker.broker_clocks.lock().unwrap().get(&addr).is_some_and(|(pop_time, _)| pop_time.abs_diff(SystemClock.now_ms()) < 60_000), "learned again");
    }

    /// The broker's clock one hour ahead of this host's: every POP answered at once with an
    /// empty body and that clock's `popTime`.
    fn an_hour_ahead(_: i32, _: &serde_json::Value) -> Option<(i32, serde_json::Value)> {
        let now = SystemClock.now_ms() + 3_600_000;
        Some((response::SUCCESS, serde_json::json!({"popTime": now.to_string(), "invisibleTime": "30000", "reviveQid": "0"})))
    }

    /// rocketmq-rust holds a POP until `bornTime` plus its poll time by its own clock: with
    /// `bornTime` from a gateway clock ahead of the broker's, a POP was held past its timeout
    /// (the fault suite's clock steps). A POP's `bornTime` is the broker's clock as its last
    /// answer showed it.
    #[tokio::test]
    async fn a_pops_born_time_is_read_from_the_brokers_clock() {
        let (addr, mut requests) = fake_broker(an_hour_ahead).await;
        let broker = Broker::new(String::new(), Duration::from_secs(5));
        let pop = || broker.pop(&addr, "g", "t", 0, 8, Duration::from_secs(30), Duration::from_millis(100));
        pop().await.expect("answered");
        let first = field(&requests.recv().await.unwrap().1, "bornTime");
        assert!(first.abs_diff(SystemClock.now_ms()) < 60_000, "no answer yet: this host's clock");
        pop().await.expect("answered");
        let second = field(&requests.recv().await.unwrap().1, "bornTime");
        assert!(second.abs_diff(SystemClock.now_ms() + 3_600_000) < 60_000, "the broker's clock: {second} against this host's {}", SystemClock.now_ms());
    }

    #[test]
    fn start_offset_info_parses() {
        let m = parse_start_offsets("0 3 17;1 0 4");
        assert_eq!(m.get("0@3"), Some(&17));
        assert_eq!(m.get("1@0"), Some(&4));
        assert!(parse_start_offsets("").is_empty());
    }
}
