//! The conformance bodies on RocketMQ lite topics (`rocketmq.lite_parents`, issue 27): every
//! topic a body names is a lite topic `lp@name` of one parent, against rocketmq-rust in pop mode.
//! A lite topic has one partition per master broker, so the bodies on two-partition topics run
//! on a cluster of two masters (which also puts partition 1 on the second broker) and the others
//! on one. Left out as on regular RocketMQ topics: log retention (the broker deletes whole
//! commit-log files only after hours).

use crate::conformance as body;
use crate::conformance::Harness;

macro_rules! lite_conformance {
    ($($masters:literal => $name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                body::$name(&Harness::rocketmq_lite($masters)).await
            }
        )*
    };
}

lite_conformance! {
    2 => publish_answers_offsets_and_events_keep_their_fields,
    2 => subscribe_receives_everything_and_acks_commit,
    2 => a_resume_token_starts_at_the_larger_of_token_and_stored_offset,
    2 => a_subscribe_by_time_starts_at_the_first_event_at_or_after_it,
    1 => restart_resumes_at_the_committed_offset,
    1 => an_admin_rewind_replays_from_the_new_offset,
    1 => boot_alignment_starts_pulling_at_the_slowest_committed_offset,
    1 => an_idempotent_publish_writes_once,
}
