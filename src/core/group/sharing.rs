//! Which member of a shared subscription gets each event: the one with the most free room,
//! taken round robin among equals, and with `order: key` the member that holds the event's key.
//! Bookkeeping only (no tasks, no channels): the group's distributor (hub.rs) offers it the hub's
//! events and the members' settlements, and sends what it assigns.
//!
//! The rules (docs/semantics.md, "Shared subscriptions"):
//! - an event goes to a live member with room; one taken back from a member (released when it
//!   left, nacked, or timed out there) goes to another member when one has room;
//! - `order: key`: while a member holds events of a key, the key's later events go to it alone,
//!   after the earlier ones (a key's events wait in offset order, each behind the one before); a
//!   key stays with its member while it lives and has room, and moves when it has none left.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use crate::core::client_state::DeliveryRef;
use crate::core::protocol::ShareOrder;
use crate::core::{FastMap, FastSet};

/// A member: the session number of its session.
pub type MemberId = u64;

/// Keys remembered with no event in flight (for stickiness) before the idle ones are forgotten.
const IDLE_KEYS_KEPT: usize = 100_000;

/// A key as the group remembers it: a hash (SipHash with this group's random keys, so a
/// publisher cannot make other keys collide with its own), 8 bytes however long the key is.
/// Two keys that collide anyway are only ordered as one.
type KeyHash = u64;

/// How long a key's later events wait for an earlier one released to the hub (a member's end, a
/// nack) to come back: longer, and they go on (a nack's long `delay_ms`, an event the hub made a
/// dead letter instead).
const RETURN_WAIT: Duration = Duration::from_secs(30);

/// An event of the hub waiting for a member.
#[derive(Debug, Clone, PartialEq)]
pub struct Offered {
    pub delivery: DeliveryRef,
    pub key: Option<String>,
    /// The event frame as the hub wrote it.
    pub text: String,
    /// What the event weighs in a window (`Event::size_bytes`).
    pub bytes: usize,
}

impl Offered {
    fn event(&self) -> (u32, u64) {
        (self.delivery.partition, self.delivery.offset)
    }
}

/// How a member settled one of its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Acked or termed: done.
    Done,
    /// Nacked: it comes back from the hub, for another member.
    Released,
    /// Nacked with a delay: it comes back from the hub when the delay is over, and until then
    /// it holds a slot of the member that nacked it (so that a member pausing events stalls
    /// itself, not its group: issue 59).
    Paused,
}

#[derive(Debug)]
struct Member {
    id: MemberId,
    capacity: usize,
    held: usize,
    /// Its window's bytes (`delivery.max_in_flight_bytes`), and what its deliveries and paused
    /// events weigh: group deliveries count in a member's byte window as its own do.
    capacity_bytes: u64,
    held_bytes: u64,
}

impl Member {
    /// Room for one more event of `bytes`: a slot, and the bytes (an event larger than the whole
    /// window still goes to a member that holds nothing, as to a client).
    fn has_room_for(&self, bytes: u64) -> bool {
        self.held < self.capacity && (self.held_bytes == 0 || self.held_bytes.saturating_add(bytes) <= self.capacity_bytes)
    }
}

/// An event `(partition, offset)` released to the hub, and since when.
type Returning = ((u32, u64), Instant);

#[derive(Debug)]
struct Held {
    member: MemberId,
    delivery: DeliveryRef,
    key: Option<KeyHash>,
    bytes: u64,
}

#[derive(Debug)]
struct KeyHold {
    member: MemberId,
    in_flight: usize,
}

/// What an offer took back from a member: the delivery the hub replaced (it timed out there).
#[derive(Debug, PartialEq, Eq)]
pub struct TakenBack {
    pub member: MemberId,
    pub delivery: DeliveryRef,
}

#[derive(Debug)]
pub struct Sharing {
    order: ShareOrder,
    members: Vec<Member>,
    /// Where the next search for a member starts (round robin among equals).
    cursor: usize,
    /// Per partition, its events waiting for a member, in offset order.
    waiting: Vec<VecDeque<Offered>>,
    /// The events waiting (a redelivery of one replaces it where it stands).
    waiting_events: FastSet<(u32, u64)>,
    /// The partition the next `assign` starts with: partitions take turns.
    next_partition: usize,
    /// Every event given to a member and not settled, by `(partition, offset)`.
    out: FastMap<(u32, u64), Held>,
    keys: FastMap<KeyHash, KeyHold>,
    /// The member an event was last taken from: it goes to another one when it can.
    avoid: FastMap<(u32, u64), MemberId>,
    /// With `order: key`: per key, its events released to the hub and not offered again yet (and
    /// since when): the key's later events wait for them, so that a key's events reach members
    /// in offset order even when the hub redelivers them in another.
    returning: FastMap<KeyHash, Vec<Returning>>,
    /// Events a member paused (`Settled::Paused`), until the hub offers them again: each holds a
    /// slot (and its bytes) of that member while it is a member (`Some`); after it left (`None`)
    /// the event still waits at the hub, in its window, charged to nobody.
    paused: FastMap<(u32, u64), Option<(MemberId, u64)>>,
    hasher: RandomState,
}

impl Sharing {
    pub fn new(order: ShareOrder) -> Self {
        Self {
            order,
            members: Vec::new(),
            cursor: 0,
            waiting: Vec::new(),
            waiting_events: FastSet::default(),
            next_partition: 0,
            out: FastMap::default(),
            keys: FastMap::default(),
            avoid: FastMap::default(),
            returning: FastMap::default(),
            paused: FastMap::default(),
            hasher: RandomState::new(),
        }
    }

    /// With `order: key`, the hash of an event's key; `None` without a key or key order.
    fn key_of(&self, offered: &Offered) -> Option<KeyHash> {
        let key = offered.key.as_deref().filter(|_| self.order == ShareOrder::Key)?;
        Some(self.hasher.hash_one(key))
    }

    /// Events paused by members that left, not offered again yet: they wait in the hub's window
    /// with no member's slot taking their place, so the window grows by them. (A member's own
    /// paused events take its slots: the members' windows together already count them.)
    pub fn paused_without_member(&self) -> usize {
        self.paused.values().filter(|member| member.is_none()).count()
    }

    /// A paused event came back (or the hub settled it): its member's slot is free again.
    fn unpause(&mut self, event: (u32, u64)) {
        if let Some(Some((member, bytes))) = self.paused.remove(&event) {
            if let Some(m) = self.members.iter_mut().find(|m| m.id == member) {
                m.held = m.held.saturating_sub(1);
                m.held_bytes = m.held_bytes.saturating_sub(bytes);
            }
        }
    }

    /// The hub subscribed again (a member brought a higher token): what it held in flight, the
    /// paused events too, went with its old subscription and is not offered again as such.
    pub fn forget_paused(&mut self) {
        for event in self.paused.keys().copied().collect::<Vec<_>>() {
            self.unpause(event);
        }
    }

    pub fn order(&self) -> ShareOrder {
        self.order
    }

    pub fn join(&mut self, member: MemberId, capacity: usize, capacity_bytes: u64) {
        if !self.members.iter().any(|m| m.id == member) {
            self.members.push(Member { id: member, capacity, held: 0, capacity_bytes, held_bytes: 0 });
        }
    }

    /// The members' windows together: how much the hub may have in flight.
    pub fn capacity(&self) -> usize {
        self.members.iter().map(|m| m.capacity).sum()
    }

    /// The members' byte windows together.
    pub fn capacity_bytes(&self) -> u64 {
        self.members.iter().fold(0u64, |sum, m| sum.saturating_add(m.capacity_bytes))
    }

    /// Removes a member; answers its deliveries still in flight, for the hub to release at once
    /// (docs/protocol.md: a session's end releases its deliveries). Its keys are free from now.
    pub fn leave(&mut self, member: MemberId) -> Vec<DeliveryRef> {
        self.members.retain(|m| m.id != member);
        // Its paused events stay paused at the hub, charged to nobody (a session that joins
        // again keeps its number: they must not free slots of its new membership).
        for owner in self.paused.values_mut().filter(|owner| owner.is_some_and(|(m, _)| m == member)) {
            *owner = None;
        }
        let mut released = Vec::new();
        let events: Vec<(u32, u64)> = self.out.iter().filter(|(_, h)| h.member == member).map(|(e, _)| *e).collect();
        for event in events {
            let held = self.out.remove(&event).expect("listed above");
            self.avoid.insert(event, member);
            self.await_return(event, held.key);
            released.push(held.delivery);
        }
        self.keys.retain(|_, hold| hold.member != member);
        released
    }

    /// A hub's event (a first delivery or a redelivery). A redelivery of an event a member still
    /// holds (its ack timed out there) is taken back from that member; one still waiting
    /// replaces its older delivery in the queue.
    pub fn offer(&mut self, offered: Offered) -> Option<TakenBack> {
        let event = offered.event();
        self.unpause(event);
        if let Some(key) = self.key_of(&offered) {
            if let Some(returning) = self.returning.get_mut(&key) {
                returning.retain(|(e, _)| *e != event);
                if returning.is_empty() {
                    self.returning.remove(&key);
                }
            }
        }
        if self.waiting_events.contains(&event) {
            if let Some(waiting) = self.waiting[event.0 as usize].iter_mut().find(|w| w.event() == event) {
                *waiting = offered;
            }
            return None;
        }
        let taken = self.out.remove(&event).map(|held| {
            self.release_room(&held);
            self.avoid.insert(event, held.member);
            TakenBack { member: held.member, delivery: held.delivery }
        });
        // In offset order per partition, redeliveries among first deliveries (which come in
        // order: at the back).
        let partition = event.0 as usize;
        if self.waiting.len() <= partition {
            self.waiting.resize_with(partition + 1, VecDeque::new);
        }
        let queue = &mut self.waiting[partition];
        match queue.back() {
            Some(last) if last.delivery.offset > event.1 => {
                let at = queue.partition_point(|w| w.delivery.offset < event.1);
                queue.insert(at, offered);
            }
            _ => queue.push_back(offered),
        }
        self.waiting_events.insert(event);
        taken
    }

    /// A keyed event went back to the hub: its key's later events wait until it is offered again.
    fn await_return(&mut self, event: (u32, u64), key: Option<KeyHash>) {
        if let Some(key) = key {
            self.returning.entry(key).or_default().push((event, Instant::now()));
        }
    }

    /// True when an earlier event of `key` in `event`'s partition is on its way back from the hub.
    fn behind_returning(&mut self, key: KeyHash, event: (u32, u64)) -> bool {
        let Some(returning) = self.returning.get_mut(&key) else { return false };
        returning.retain(|(_, since)| since.elapsed() < RETURN_WAIT);
        if returning.is_empty() {
            self.returning.remove(&key);
            return false;
        }
        returning.iter().any(|((partition, offset), _)| *partition == event.0 && *offset < event.1)
    }

    /// The hub settled `event` itself (a dead letter): it is forgotten, waiting or held; answers
    /// the member it is taken from.
    pub fn forget(&mut self, event: (u32, u64)) -> Option<TakenBack> {
        self.unpause(event);
        if self.waiting_events.remove(&event) {
            self.waiting[event.0 as usize].retain(|w| w.event() != event);
        }
        self.avoid.remove(&event);
        for returning in self.returning.values_mut() {
            returning.retain(|(e, _)| *e != event);
        }
        self.returning.retain(|_, r| !r.is_empty());
        let held = self.out.remove(&event)?;
        self.release_room(&held);
        Some(TakenBack { member: held.member, delivery: held.delivery })
    }

    /// A member settled `delivery`, the one it holds of its event (an older id of an event given
    /// to it again is no longer what it holds: the hub answers that one). False when it held no
    /// such delivery.
    pub fn settle(&mut self, member: MemberId, delivery: DeliveryRef, how: Settled) -> bool {
        let event = (delivery.partition, delivery.offset);
        match self.out.get(&event) {
            Some(held) if held.member == member && held.delivery.seq == delivery.seq => {}
            _ => return false,
        }
        let held = self.out.remove(&event).expect("checked above");
        match how {
            Settled::Done => {
                self.release_room(&held);
                self.avoid.remove(&event);
            }
            Settled::Released => {
                self.release_room(&held);
                self.avoid.insert(event, member);
                self.await_return(event, held.key);
            }
            Settled::Paused => {
                // The member's slot and bytes stay taken until the event comes back.
                self.release_key(&held);
                self.paused.insert(event, Some((member, held.bytes)));
                self.avoid.insert(event, member);
                self.await_return(event, held.key);
            }
        }
        true
    }

    fn release_room(&mut self, held: &Held) {
        if let Some(m) = self.members.iter_mut().find(|m| m.id == held.member) {
            m.held = m.held.saturating_sub(1);
            m.held_bytes = m.held_bytes.saturating_sub(held.bytes);
        }
        self.release_key(held);
    }

    fn release_key(&mut self, held: &Held) {
        if let Some(key) = held.key {
            if let Some(hold) = self.keys.get_mut(&key) {
                hold.in_flight = hold.in_flight.saturating_sub(1);
            }
        }
    }

    /// Gives waiting events to members with room, in queue order (offset order per partition);
    /// answers `(member, event)` for each.
    pub fn assign(&mut self) -> Vec<(MemberId, Offered)> {
        let mut given = Vec::new();
        // Keys with an earlier event still waiting: their later ones wait behind it.
        let mut blocked: FastSet<KeyHash> = FastSet::default();
        let partitions = self.waiting.len();
        'partitions: for turn in 0..partitions {
            let partition = (self.next_partition + turn) % partitions;
            let mut at = 0;
            while at < self.waiting[partition].len() {
                if !self.members.iter().any(|m| m.held < m.capacity) {
                    break 'partitions;
                }
                let waiting = &self.waiting[partition][at];
                let event = waiting.event();
                let key = self.key_of(waiting);
                let bytes = waiting.bytes as u64;
                let target = match key {
                    Some(key) if blocked.contains(&key) || self.behind_returning(key, event) => None,
                    Some(key) => match self.keys.get(&key) {
                        // Its member alone, while it holds events of the key.
                        Some(hold) if hold.in_flight > 0 => Some(hold.member).filter(|m| self.has_room(*m, bytes)),
                        // Sticky while its member lives and has room.
                        Some(hold) if self.has_room(hold.member, bytes) => Some(hold.member),
                        _ => self.pick(self.avoid.get(&event).copied(), bytes),
                    },
                    None => self.pick(self.avoid.get(&event).copied(), bytes),
                };
                let Some(member) = target else {
                    if let Some(key) = key {
                        blocked.insert(key);
                    }
                    at += 1;
                    continue;
                };
                let offered = self.waiting[partition].remove(at).expect("index checked");
                self.waiting_events.remove(&event);
                if let Some(m) = self.members.iter_mut().find(|m| m.id == member) {
                    m.held += 1;
                    m.held_bytes = m.held_bytes.saturating_add(bytes);
                }
                if let Some(key) = key {
                    let hold = self.keys.entry(key).or_insert(KeyHold { member, in_flight: 0 });
                    hold.member = member;
                    hold.in_flight += 1;
                }
                self.out.insert(event, Held { member, delivery: offered.delivery, key, bytes });
                given.push((member, offered));
            }
        }
        self.next_partition = (self.next_partition + 1) % partitions.max(1);
        if self.keys.len() > IDLE_KEYS_KEPT {
            self.keys.retain(|_, hold| hold.in_flight > 0);
        }
        // Bounded by what can be in flight: the entries of events that never came back (the hub
        // made them dead letters) do not pile up.
        let bound = self.capacity().max(1) * 4;
        if self.avoid.len() > bound {
            let out = &self.out;
            self.avoid.retain(|event, _| out.contains_key(event));
        }
        if self.returning.len() > bound {
            self.returning.retain(|_, r| {
                r.retain(|(_, since)| since.elapsed() < RETURN_WAIT);
                !r.is_empty()
            });
        }
        given
    }

    fn has_room(&self, member: MemberId, bytes: u64) -> bool {
        self.members.iter().any(|m| m.id == member && m.has_room_for(bytes))
    }

    /// The member with the most free room (slots) among those with room for an event of `bytes`,
    /// searched from the cursor so that equals take turns; `avoid` only when no other has room.
    fn pick(&mut self, avoid: Option<MemberId>, bytes: u64) -> Option<MemberId> {
        let n = self.members.len();
        let mut best: Option<(usize, usize)> = None;
        for i in 0..n {
            let index = (self.cursor + i) % n;
            let m = &self.members[index];
            let free = m.capacity.saturating_sub(m.held);
            if !m.has_room_for(bytes) || Some(m.id) == avoid {
                continue;
            }
            if best.is_none_or(|(_, most)| free > most) {
                best = Some((index, free));
            }
        }
        let index = match best {
            Some((index, _)) => index,
            None => self.members.iter().position(|m| Some(m.id) == avoid && m.has_room_for(bytes))?,
        };
        self.cursor = (index + 1) % n;
        Some(self.members[index].id)
    }

    /// Per member: events in flight and keys held (`/admin/groups`).
    pub fn members(&self) -> Vec<(MemberId, usize, usize)> {
        self.members.iter().map(|m| (m.id, m.held, self.keys.values().filter(|h| h.member == m.id && h.in_flight > 0).count())).collect()
    }

    /// Events waiting for a member with room.
    pub fn waiting(&self) -> usize {
        self.waiting_events.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(seq: u64, partition: u32, offset: u64, key: Option<&str>) -> Offered {
        Offered { delivery: DeliveryRef { seq, slot: 0, partition, offset }, key: key.map(str::to_string), text: String::new(), bytes: 10 }
    }

    #[test]
    fn events_go_round_robin_to_members_with_room_and_wait_when_none_has() {
        let mut s = Sharing::new(ShareOrder::None);
        s.join(1, 2, u64::MAX);
        s.join(2, 2, u64::MAX);
        for offset in 0..5 {
            assert_eq!(s.offer(offered(offset, 0, offset, None)), None);
        }
        let given: Vec<MemberId> = s.assign().iter().map(|(m, _)| *m).collect();
        assert_eq!(given, vec![1, 2, 1, 2]);
        assert_eq!(s.waiting(), 1);
        assert!(s.assign().is_empty(), "nobody has room");
        assert!(s.settle(2, DeliveryRef { seq: 1, slot: 0, partition: 0, offset: 1 }, Settled::Done));
        assert!(!s.settle(1, DeliveryRef { seq: 1, slot: 0, partition: 0, offset: 1 }, Settled::Done), "settled once");
        assert_eq!(s.assign().iter().map(|(m, o)| (*m, o.delivery.offset)).collect::<Vec<_>>(), vec![(2, 4)]);
    }

    #[test]
    fn a_members_byte_window_bounds_its_group_deliveries_and_a_paused_event_keeps_its_bytes() {
        let mut s = Sharing::new(ShareOrder::None);
        // Room for 10 events but 25 bytes: two events of 10 bytes.
        s.join(1, 10, 25);
        for offset in 0..3 {
            s.offer(offered(offset, 0, offset, None));
        }
        assert_eq!(s.assign().len(), 2);
        assert_eq!(s.waiting(), 1, "the third waits: 30 bytes would exceed 25");
        // Paused, an event keeps its bytes at the member until it comes back.
        assert!(s.settle(1, DeliveryRef { seq: 0, slot: 0, partition: 0, offset: 0 }, Settled::Paused));
        assert!(s.assign().is_empty());
        assert!(s.settle(1, DeliveryRef { seq: 1, slot: 0, partition: 0, offset: 1 }, Settled::Done));
        assert_eq!(s.assign().len(), 1, "acked, its bytes are free again");
        // An event larger than the whole window goes to a member that holds nothing.
        let mut big = offered(9, 1, 0, None);
        big.bytes = 1000;
        s.join(2, 10, 25);
        s.offer(big);
        assert_eq!(s.assign().iter().map(|(m, o)| (*m, o.delivery.offset)).collect::<Vec<_>>(), vec![(2, 0)]);
        s.offer(offered(10, 1, 1, None));
        assert!(s.assign().is_empty(), "nothing more fits beside it, nor at the first member");
    }

    #[test]
    fn a_released_or_timed_out_event_goes_to_another_member_unless_alone() {
        let mut s = Sharing::new(ShareOrder::None);
        s.join(1, 10, u64::MAX);
        s.join(2, 10, u64::MAX);
        s.offer(offered(1, 0, 7, None));
        let (first, _) = s.assign().pop().unwrap();
        // The hub redelivers it (an ack timeout): taken back from the first, given to the other.
        assert_eq!(s.offer(offered(2, 0, 7, None)), Some(TakenBack { member: first, delivery: DeliveryRef { seq: 1, slot: 0, partition: 0, offset: 7 } }));
        let (second, _) = s.assign().pop().unwrap();
        assert_ne!(first, second);
        // Nacked there: back to the first.
        assert!(s.settle(second, DeliveryRef { seq: 2, slot: 0, partition: 0, offset: 7 }, Settled::Released));
        s.offer(offered(3, 0, 7, None));
        assert_eq!(s.assign().pop().unwrap().0, first);
        // Alone, a member gets its own released events again.
        let released = s.leave(second);
        assert!(released.is_empty());
        assert!(s.settle(first, DeliveryRef { seq: 3, slot: 0, partition: 0, offset: 7 }, Settled::Released));
        s.offer(offered(4, 0, 7, None));
        assert_eq!(s.assign().pop().unwrap().0, first);
    }

    #[test]
    fn a_paused_event_holds_its_members_slot_until_it_comes_back_also_after_the_member_left() {
        let mut s = Sharing::new(ShareOrder::None);
        s.join(1, 2, u64::MAX);
        s.offer(offered(1, 0, 0, None));
        s.offer(offered(2, 0, 1, None));
        assert_eq!(s.assign().len(), 2);
        let first = DeliveryRef { seq: 1, slot: 0, partition: 0, offset: 0 };
        assert!(s.settle(1, first, Settled::Paused));
        assert_eq!(s.paused_without_member(), 0, "its member's slot counts it");
        // Member 1 is still full: the paused event holds its slot, so the next goes to member 2.
        s.offer(offered(3, 0, 2, None));
        assert!(s.assign().is_empty(), "member 1 paused one and holds another: no room");
        s.join(2, 2, u64::MAX);
        assert_eq!(s.assign().iter().map(|(m, o)| (*m, o.delivery.offset)).collect::<Vec<_>>(), vec![(2, 2)]);
        // Member 1 leaves: the paused event still waits at the hub, counted until it comes back.
        assert_eq!(s.leave(1).len(), 1, "the event it held, not the paused one");
        assert_eq!(s.paused_without_member(), 1);
        // Joining again with the same number does not inherit the old paused event's slot.
        s.join(1, 2, u64::MAX);
        s.offer(offered(4, 0, 0, None));
        assert_eq!(s.paused_without_member(), 0);
        assert_eq!(s.members().iter().find(|(m, _, _)| *m == 1).map(|(_, held, _)| *held), Some(0));
        s.leave(1);
        assert_eq!(s.assign().iter().map(|(m, o)| (*m, o.delivery.offset)).collect::<Vec<_>>(), vec![(2, 0)]);
        // A Released nack frees the slot at once.
        assert!(s.settle(2, DeliveryRef { seq: 4, slot: 0, partition: 0, offset: 0 }, Settled::Released));
        assert_eq!(s.paused_without_member(), 0);
        // Paused, then the hub subscribes again: the member's slot is freed.
        s.offer(offered(5, 0, 3, None));
        let (member, given) = s.assign().pop().unwrap();
        assert!(s.settle(member, given.delivery, Settled::Paused));
        s.forget_paused();
        assert_eq!(s.members().iter().find(|(m, _, _)| *m == member).map(|(_, held, _)| *held), Some(1), "offset 2 only");
    }

    #[test]
    fn a_key_is_in_flight_at_one_member_at_a_time_and_in_offset_order() {
        let mut s = Sharing::new(ShareOrder::Key);
        s.join(1, 1, u64::MAX);
        s.join(2, 5, u64::MAX);
        for offset in 0..4 {
            s.offer(offered(offset, 0, offset, Some("k")));
        }
        s.offer(offered(9, 0, 9, Some("other")));
        s.offer(offered(10, 0, 10, None));
        let given: Vec<(MemberId, u64)> = s.assign().iter().map(|(m, o)| (*m, o.delivery.offset)).collect();
        // "k" goes to the emptier member 2 and stays there; the others share what is left.
        assert_eq!(given.iter().filter(|(_, o)| *o < 4).map(|(m, _)| *m).collect::<Vec<_>>(), vec![2, 2, 2, 2]);
        assert_eq!(given.iter().filter(|(_, o)| *o < 4).map(|(_, o)| *o).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(given.len(), 6);
        // Member 2 leaves holding "k": its events are released, and the key is free.
        let released: Vec<u64> = s.leave(2).iter().map(|d| d.offset).collect();
        assert!(released.contains(&0) && released.contains(&3));
        // Member 1, the one left, is full: the key's next event waits.
        s.offer(offered(11, 0, 11, Some("k")));
        let held_by_1 = s.members().iter().find(|(m, _, _)| *m == 1).map(|(_, held, _)| *held).unwrap();
        assert_eq!(held_by_1, 1);
        assert!(s.assign().is_empty());
    }

    #[test]
    fn a_keys_later_event_waits_behind_its_earlier_one_while_other_keys_go_on() {
        let mut s = Sharing::new(ShareOrder::Key);
        s.join(1, 1, u64::MAX);
        s.join(2, 1, u64::MAX);
        s.offer(offered(1, 0, 0, Some("a")));
        s.offer(offered(2, 0, 1, Some("a")));
        s.offer(offered(3, 0, 2, Some("b")));
        let given: Vec<(MemberId, u64)> = s.assign().iter().map(|(m, o)| (*m, o.delivery.offset)).collect();
        // "a"@1 may not go to member 2 while "a"@0 is at member 1: "b" takes member 2.
        assert_eq!(given, vec![(1, 0), (2, 2)]);
        assert!(s.settle(1, DeliveryRef { seq: 1, slot: 0, partition: 0, offset: 0 }, Settled::Done));
        assert_eq!(s.assign().iter().map(|(m, o)| (*m, o.delivery.offset)).collect::<Vec<_>>(), vec![(1, 1)]);
    }

    #[test]
    fn a_keys_released_events_come_back_before_its_later_ones_whatever_order_the_hub_sends_them() {
        let mut s = Sharing::new(ShareOrder::Key);
        s.join(1, 10, u64::MAX);
        s.join(2, 10, u64::MAX);
        for offset in [40, 44, 48] {
            s.offer(offered(offset, 0, offset, Some("k0")));
        }
        let first: Vec<MemberId> = s.assign().iter().map(|(m, _)| *m).collect();
        assert!(first.iter().all(|m| *m == first[0]), "one member holds the key: {first:?}");
        let other = if first[0] == 1 { 2 } else { 1 };
        assert_eq!(s.leave(first[0]).len(), 3);
        // The hub sends the released ones back out of order: 48 and 44 wait for 40.
        s.offer(offered(101, 0, 48, Some("k0")));
        s.offer(offered(102, 0, 44, Some("k0")));
        assert!(s.assign().is_empty(), "40 is still on its way back");
        s.offer(offered(103, 0, 40, Some("k0")));
        let order: Vec<(MemberId, u64)> = s.assign().iter().map(|(m, o)| (*m, o.delivery.offset)).collect();
        assert_eq!(order, vec![(other, 40), (other, 44), (other, 48)]);
        // A nacked one holds its key's later ones back the same way.
        assert!(s.settle(other, DeliveryRef { seq: 103, slot: 0, partition: 0, offset: 40 }, Settled::Released));
        s.offer(offered(104, 0, 52, Some("k0")));
        let given: Vec<u64> = s.assign().iter().map(|(_, o)| o.delivery.offset).collect();
        assert!(given.is_empty(), "52 waits for 40: {given:?}");
    }
}
