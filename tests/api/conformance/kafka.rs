//! The conformance bodies on the Kafka backend, against a real Kafka-protocol broker (tansu).
crate::conformance_tests!(super::Harness::kafka());
