//! How ackgate numbers a RocketMQ topic's partitions when the topic has queues on several master
//! brokers: partition = (broker name, queue id), brokers in a stable order, each broker's queues
//! in id order. With one broker, partition p is queue p.
//!
//! The order is fixed the first time ackgate sees the topic (brokers sorted by name) and kept in
//! `data_dir/rocketmq-partitions.properties`, one `topic=broker-a:4,broker-b:4` line per topic:
//! committed offsets, pull cursors and receipt handles are per partition, so a partition must
//! never become another broker's queue. A broker of the layout missing from the route (its master
//! away) keeps its partitions, unavailable until it is back. A route that would renumber (a
//! broker with fewer queues, a broker before the last with more) is refused: the stored layout
//! stays, the change is logged and counted, and readiness is false until the route fits again.
//! Queues that only add partitions after the existing ones (a new broker, the last broker
//! growing) are taken.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::core::names::TopicName;

/// Name of the layout file inside `storage.data_dir`.
pub const LAYOUT_FILE: &str = "rocketmq-partitions.properties";

/// Queue count per broker, in partition order.
pub type Layout = Vec<(String, u32)>;

/// What a route means for a topic's stored layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// Numbered as before (possibly with partitions added after the old ones): use this layout.
    Fits(Layout),
    /// It would renumber partitions: keep the stored layout; the reason says why.
    Renumbers(String),
}

/// Fits the brokers' queue counts of a fresh route (any order) to the stored layout.
pub fn fit(stored: Option<&Layout>, routed: &[(String, u32)]) -> Fit {
    let mut routed: BTreeMap<&str, u32> = routed.iter().filter(|(_, q)| *q > 0).map(|(b, q)| (b.as_str(), *q)).collect();
    let Some(stored) = stored.filter(|s| !s.is_empty()) else {
        return Fit::Fits(routed.into_iter().map(|(b, q)| (b.to_string(), q)).collect());
    };
    let mut layout = Layout::with_capacity(stored.len() + routed.len());
    for (i, (broker, queues)) in stored.iter().enumerate() {
        let last = i + 1 == stored.len();
        match routed.remove(broker.as_str()) {
            // Away: its partitions stay its own, unavailable meanwhile.
            None => layout.push((broker.clone(), *queues)),
            Some(now) if now < *queues => return Fit::Renumbers(format!("broker {broker} routes {now} queues, {queues} before")),
            Some(now) if now > *queues && !last => {
                return Fit::Renumbers(format!("broker {broker} routes {now} queues, {queues} before, and brokers after it would be renumbered"))
            }
            Some(now) => layout.push((broker.clone(), now)),
        }
    }
    // Brokers new to the topic: partitions after every existing one, in name order.
    layout.extend(routed.into_iter().map(|(b, q)| (b.to_string(), q)));
    Fit::Fits(layout)
}

/// The broker and queue id of `partition` under `layout`.
pub fn queue_of(layout: &Layout, partition: u32) -> Option<(&str, u32)> {
    let mut first = 0u32;
    for (broker, queues) in layout {
        if partition < first.saturating_add(*queues) {
            return Some((broker.as_str(), partition - first));
        }
        first = first.saturating_add(*queues);
    }
    None
}

/// The partition a broker's queue is, if the layout has it.
pub fn partition_of(layout: &Layout, broker: &str, queue_id: u32) -> Option<u32> {
    let mut first = 0u32;
    for (name, queues) in layout {
        if name == broker {
            return (queue_id < *queues).then(|| first.saturating_add(queue_id));
        }
        first = first.saturating_add(*queues);
    }
    None
}

pub fn partitions(layout: &Layout) -> u32 {
    layout.iter().map(|(_, q)| *q).fold(0u32, u32::saturating_add)
}

/// Where one partition lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionQueue {
    pub broker_name: String,
    pub broker_addr: String,
    pub queue_id: u32,
}

/// A topic's partitions as ackgate numbers them: its layout, and the master address of each of
/// its brokers the route names now (none for a master away: its partitions are unavailable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub layout: Layout,
    addrs: BTreeMap<String, String>,
}

impl Route {
    /// `addrs`: every broker's master address last routed, by broker name.
    pub fn new(layout: Layout, addrs: &HashMap<String, String>) -> Self {
        let addrs = layout.iter().filter_map(|(b, _)| Some((b.clone(), addrs.get(b)?.clone()))).collect();
        Self { layout, addrs }
    }

    pub fn partitions(&self) -> u32 {
        partitions(&self.layout)
    }

    /// Where `partition` lives: `None` when the topic has no such partition, `Err` with the
    /// broker's name when its address is not known (its master away since before this start).
    pub fn queue(&self, partition: u32) -> Option<Result<PartitionQueue, &str>> {
        let (broker, queue_id) = queue_of(&self.layout, partition)?;
        Some(match self.addrs.get(broker) {
            Some(addr) => Ok(PartitionQueue { broker_name: broker.to_string(), broker_addr: addr.clone(), queue_id }),
            None => Err(broker),
        })
    }

    pub fn addr_of(&self, broker: &str) -> Option<&str> {
        self.addrs.get(broker).map(String::as_str)
    }

    /// Every broker of the layout with its address, `None` for one not known (a delete must
    /// reach each).
    pub fn broker_addrs(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.layout.iter().map(|(b, _)| (b.as_str(), self.addr_of(b)))
    }
}

/// Every topic's layout, kept in `LAYOUT_FILE`.
pub struct Layouts {
    path: PathBuf,
    layouts: Mutex<BTreeMap<TopicName, Layout>>,
}

impl Layouts {
    /// Loads the file when there is one. A line that does not parse fails the start: guessing a
    /// numbering would mix up partitions.
    pub fn load(path: PathBuf) -> io::Result<Self> {
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let mut layouts = BTreeMap::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("{}: unreadable line {line:?}", path.display()));
            let (topic, brokers) = line.split_once('=').ok_or_else(bad)?;
            let topic = TopicName::parse(topic).map_err(|_| bad())?;
            let layout = brokers
                .split(',')
                .map(|entry| {
                    let (broker, queues) = entry.rsplit_once(':')?;
                    Some((broker.to_string(), queues.parse().ok()?)).filter(|(b, _): &(String, u32)| !b.is_empty())
                })
                .collect::<Option<Layout>>()
                .ok_or_else(bad)?;
            layouts.insert(topic, layout);
        }
        Ok(Self { path, layouts: Mutex::new(layouts) })
    }

    pub fn get(&self, topic: &TopicName) -> Option<Layout> {
        self.lock().get(topic).cloned()
    }

    /// Stores a topic's layout: the file first (under the lock, so two changes are written in
    /// the order they are made), then memory, so a failed write is tried again next time.
    pub fn set(&self, topic: &TopicName, layout: Layout) -> io::Result<()> {
        let mut layouts = self.lock();
        if layouts.get(topic) == Some(&layout) {
            return Ok(());
        }
        let mut changed = layouts.clone();
        changed.insert(topic.clone(), layout);
        self.save(&changed)?;
        *layouts = changed;
        Ok(())
    }

    pub fn remove(&self, topic: &TopicName) -> io::Result<()> {
        let mut layouts = self.lock();
        if !layouts.contains_key(topic) {
            return Ok(());
        }
        let mut changed = layouts.clone();
        changed.remove(topic);
        self.save(&changed)?;
        *layouts = changed;
        Ok(())
    }

    fn save(&self, layouts: &BTreeMap<TopicName, Layout>) -> io::Result<()> {
        let mut text = String::from("# ackgate: partition numbering of RocketMQ topics (broker:queues, in partition order)\n");
        for (topic, layout) in layouts {
            let brokers: Vec<String> = layout.iter().map(|(b, q)| format!("{b}:{q}")).collect();
            text.push_str(&format!("{topic}={}\n", brokers.join(",")));
        }
        crate::durable_files::write_atomically(&self.path, text.as_bytes())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<TopicName, Layout>> {
        self.layouts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(entries: &[(&str, u32)]) -> Layout {
        entries.iter().map(|(b, q)| (b.to_string(), *q)).collect()
    }

    #[test]
    fn a_brokers_queue_maps_back_to_its_partition() {
        let l = layout(&[("broker-a", 2), ("broker-b", 3)]);
        assert_eq!(partition_of(&l, "broker-a", 1), Some(1));
        assert_eq!(partition_of(&l, "broker-b", 0), Some(2));
        assert_eq!(partition_of(&l, "broker-b", 2), Some(4));
        assert_eq!(partition_of(&l, "broker-b", 3), None, "a queue the layout does not have");
        assert_eq!(partition_of(&l, "broker-c", 0), None);
        for p in 0..5 {
            let (broker, queue) = queue_of(&l, p).unwrap();
            assert_eq!(partition_of(&l, broker, queue), Some(p));
        }
    }

    #[test]
    fn a_first_route_numbers_brokers_by_name() {
        let fitted = fit(None, &layout(&[("b", 2), ("a", 4), ("c", 0)]));
        assert_eq!(fitted, Fit::Fits(layout(&[("a", 4), ("b", 2)])), "a broker with no queue is no partition");
        let Fit::Fits(l) = fitted else { unreachable!() };
        assert_eq!(partitions(&l), 6);
        assert_eq!(queue_of(&l, 0), Some(("a", 0)));
        assert_eq!(queue_of(&l, 3), Some(("a", 3)));
        assert_eq!(queue_of(&l, 4), Some(("b", 0)));
        assert_eq!(queue_of(&l, 5), Some(("b", 1)));
        assert_eq!(queue_of(&l, 6), None);
        assert_eq!(queue_of(&l, u32::MAX), None);
    }

    #[test]
    fn a_route_that_would_renumber_is_refused_and_additions_go_last() {
        let stored = layout(&[("b", 2), ("c", 2)]);
        // A broker sorting before the others joins: its queues come after, nothing moves.
        assert_eq!(fit(Some(&stored), &layout(&[("a", 2), ("b", 2), ("c", 2)])), Fit::Fits(layout(&[("b", 2), ("c", 2), ("a", 2)])));
        // The last broker grows: partitions added at the end.
        assert_eq!(fit(Some(&stored), &layout(&[("b", 2), ("c", 3)])), Fit::Fits(layout(&[("b", 2), ("c", 3)])));
        // A broker away keeps its partitions (unavailable until it is back).
        assert_eq!(fit(Some(&stored), &layout(&[("c", 2)])), Fit::Fits(stored.clone()));
        assert_eq!(fit(Some(&stored), &layout(&[])), Fit::Fits(stored.clone()));
        for (routed, why) in [
            (layout(&[("b", 1), ("c", 2)]), "fewer queues"),
            (layout(&[("b", 2), ("c", 1)]), "fewer queues on the last"),
            (layout(&[("b", 3), ("c", 2)]), "a broker before the last grows"),
        ] {
            assert!(matches!(fit(Some(&stored), &routed), Fit::Renumbers(_)), "{why}");
        }
    }

    #[test]
    fn layouts_survive_a_reload_and_a_bad_file_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LAYOUT_FILE);
        let topic = TopicName::parse("orders").unwrap();
        let layouts = Layouts::load(path.clone()).unwrap();
        layouts.set(&topic, layout(&[("broker-a", 4), ("broker-b", 4)])).unwrap();
        assert_eq!(Layouts::load(path.clone()).unwrap().get(&topic), Some(layout(&[("broker-a", 4), ("broker-b", 4)])));
        layouts.remove(&topic).unwrap();
        assert_eq!(Layouts::load(path.clone()).unwrap().get(&topic), None);
        std::fs::write(&path, "orders=broker-a:x\n").unwrap();
        assert!(Layouts::load(path).is_err());
    }
}
