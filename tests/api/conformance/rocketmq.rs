//! The conformance bodies on the RocketMQ backend in both modes, against rocketmq-rust (a Rust
//! port of RocketMQ's name server and broker, not Apache's Java broker). The log-retention body
//! is left out: the broker deletes whole commit-log files only after `fileReservedTime` hours,
//! which a test cannot wait for, and it has no request that cuts a queue's head.

macro_rules! rocketmq_conformance {
    ($mode:literal, $masters:literal) => {
        use crate::conformance as body;
        fn harness() -> crate::conformance::Harness {
            crate::conformance::Harness::rocketmq($mode, $masters)
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn publish_answers_offsets_and_events_keep_their_fields() {
            body::publish_answers_offsets_and_events_keep_their_fields(&harness()).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_subscribe_by_time_starts_at_the_first_event_at_or_after_it() {
            body::a_subscribe_by_time_starts_at_the_first_event_at_or_after_it(&harness()).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_idempotent_publish_writes_once() {
            body::an_idempotent_publish_writes_once(&harness()).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn subscribe_receives_everything_and_acks_commit() {
            body::subscribe_receives_everything_and_acks_commit(&harness()).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn restart_resumes_at_the_committed_offset() {
            body::restart_resumes_at_the_committed_offset(&harness()).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_admin_rewind_replays_from_the_new_offset() {
            body::an_admin_rewind_replays_from_the_new_offset(&harness()).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn boot_alignment_starts_pulling_at_the_slowest_committed_offset() {
            body::boot_alignment_starts_pulling_at_the_slowest_committed_offset(&harness()).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_resume_token_starts_at_the_larger_of_token_and_stored_offset() {
            body::a_resume_token_starts_at_the_larger_of_token_and_stored_offset(&harness()).await
        }
    };
}

mod pop {
    rocketmq_conformance!("pop", 1);
}

mod pull {
    rocketmq_conformance!("pull", 1);
}

/// On two masters (issue 22): the two-partition bodies' topics have a queue on each master, the
/// one-partition bodies' a queue on the first (as `POST /topics` creates them).
mod pop_two_masters {
    rocketmq_conformance!("pop", 2);
}

mod pull_two_masters {
    rocketmq_conformance!("pull", 2);
}
