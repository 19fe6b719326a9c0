//! What a session and its transport exchange: frames in (`Inbound`), frames out (`Outbound`).
//! Its own module so that a transport that is no socket (a shared subscription's distributor,
//! `core::group`) needs nothing of the session's code.

/// What the transport hands the session.
#[derive(Debug)]
pub enum Inbound {
    Text(String),
    /// A binary frame: not part of the protocol.
    Binary,
    /// A frame over `limits.max_frame_bytes`.
    TooLarge,
    /// The client broke the transport's protocol (a WebSocket's framing: close 1002, or 1007 for
    /// text that is not UTF-8): the session closes with this code and reason.
    Broken(u16, &'static str),
    /// A sign of life that is not a frame of the protocol (a WebSocket pong or ping).
    Alive,
    /// Frames sent together by a transport that answers them itself (a Server-Sent Events
    /// session's POST): handled in order like text frames, and what the session sends in answer
    /// to them goes back through `answer`, not down the stream.
    Frames {
        texts: Vec<String>,
        answer: tokio::sync::oneshot::Sender<Vec<String>>,
    },
}

/// What the session hands the transport.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    Text(String),
    Close(u16, String),
    /// A keepalive probe (a WebSocket ping); the peer's answer comes back as `Inbound::Alive`.
    Ping,
    /// An event frame of a shared subscription's hub (transport `Group`), with what its group
    /// shares it out by (`core::group`). No other session sends one.
    /// Boxed: every frame of every session is an `Outbound`, and this one is rare and large.
    Shared(Box<SharedEvent>),
    /// A group's hub settled event `(partition, offset)` itself (a dead letter at
    /// `max_attempts`): its group forgets it at whichever member holds it.
    SharedGone(u32, u64),
}

/// An event frame of a group's hub, with its delivery id and key at hand.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedEvent {
    pub text: String,
    pub delivery: crate::core::client_state::DeliveryRef,
    pub key: Option<String>,
    /// What the event weighs in a member's byte window (`Event::size_bytes`).
    pub bytes: usize,
}

/// A transport made of two halves: a stream of frames in and a sink for frames out (a group's
/// hub and a Server-Sent Events session, whose two directions are separate channels). A
/// WebSocket is one object for both (`http::ws_connection`).
pub struct Duplex<I, O> {
    pub inbound: I,
    pub outbound: O,
}

impl<I: futures_util::Stream<Item = Inbound> + Unpin, O: Unpin> futures_util::Stream for Duplex<I, O> {
    type Item = Inbound;

    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Inbound>> {
        std::pin::Pin::new(&mut self.inbound).poll_next(cx)
    }
}

impl<I: Unpin, O: futures_util::Sink<Outbound> + Unpin> futures_util::Sink<Outbound> for Duplex<I, O> {
    type Error = O::Error;

    fn poll_ready(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), O::Error>> {
        std::pin::Pin::new(&mut self.outbound).poll_ready(cx)
    }

    fn start_send(mut self: std::pin::Pin<&mut Self>, frame: Outbound) -> Result<(), O::Error> {
        std::pin::Pin::new(&mut self.outbound).start_send(frame)
    }

    fn poll_flush(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), O::Error>> {
        std::pin::Pin::new(&mut self.outbound).poll_flush(cx)
    }

    fn poll_close(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), O::Error>> {
        std::pin::Pin::new(&mut self.outbound).poll_close(cx)
    }
}
