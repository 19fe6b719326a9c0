//! How a backend or offset-store failure reaches a client: the error frame (code and message)
//! for it, the detail that would leak addresses or paths kept for the log.

use super::backend::BackendError;
use super::offsets::StoreError;
use super::protocol::{ErrorCode, FrameError};

pub fn backend_frame_error(e: BackendError) -> FrameError {
    match e {
        BackendError::UnknownTopic(t) => FrameError::new(ErrorCode::UnknownTopic, format!("topic {t} does not exist")),
        BackendError::InvalidInput(m) | BackendError::UnknownPartition(m) => FrameError::new(ErrorCode::BadFrame, m),
        BackendError::Conflict(m) => FrameError::new(ErrorCode::Conflict, m),
        BackendError::LimitExceeded(m) => FrameError::new(ErrorCode::LimitExceeded, m),
        // The detail (broker addresses, file paths) goes to the log, not to the client.
        BackendError::Unavailable(m) | BackendError::Io(m) => FrameError::unavailable("the log backend", m),
        truncated @ BackendError::Truncated { .. } => FrameError::unavailable("the log backend", truncated),
    }
}

pub fn store_frame_error(e: StoreError) -> FrameError {
    FrameError::unavailable("the offset store", e)
}
