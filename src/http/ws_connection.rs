//! A WebSocket connection after its handshake: the session's frames in (`Stream` of `Inbound`)
//! and out (`Sink` of `Outbound`) over the upgraded socket, with `http::ws_codec` doing the
//! framing. One object for both directions, so no lock is shared between a read half and a write
//! half: the session task reads and writes it in turns.
//!
//! Between reads and between writes it holds no buffer: a read goes into a buffer on the stack,
//! bytes read are kept only while a frame is still incomplete, and encoded frames only until the
//! socket has taken them. Pongs and the answer to a client's close are written by the reading
//! side as soon as it decodes their cause, also while the session has nothing of its own to send.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::ws_codec::{self, Decoder, Message};
use crate::core::transport::{Inbound, Outbound};

/// Encoded frames beyond this are written before more are taken (a sink's backpressure).
const WRITE_AHEAD_BYTES: usize = 64 * 1024;
/// Answers (pongs) queued beyond this stop the reading until the socket takes them: a client
/// that pings and never reads cannot make the gateway queue pongs without end.
const ANSWERS_AHEAD_BYTES: usize = 4 * 1024;
/// The most one read asks for (`limits.ws_read_buffer_bytes` is bounded by it): the read goes
/// into a buffer on the stack, and only the bytes of an incomplete frame are kept after it.
const MAX_READ_BYTES: usize = crate::config::MAX_WS_READ_BYTES;

pub struct WebSocketConnection<IO> {
    io: IO,
    decoder: Decoder,
    /// How much one read from the socket asks for.
    read_size: usize,
    /// Bytes read and not decoded yet, from `unread_start`: empty (no allocation) between frames.
    unread: Vec<u8>,
    unread_start: usize,
    /// Encoded frames, from `unwritten_start` on not yet taken by the socket.
    unwritten: Vec<u8>,
    unwritten_start: usize,
    /// Answers were written that a flush must push on (TLS keeps them until flushed).
    answers_unflushed: bool,
    reading: Reading,
    /// A close frame was written or queued: nothing more is sent after it.
    close_sent: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    Open,
    /// The client closed, or the socket ended or failed: the stream is over.
    Ended,
    /// A message over the limit, or a frame that broke the protocol: the session closes with
    /// 1009 (or 1002, 1007); nothing more is read meanwhile.
    Stopped,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> WebSocketConnection<IO> {
    pub fn new(io: IO, max_message_bytes: usize, read_size: usize) -> Self {
        Self {
            io,
            decoder: Decoder::new(max_message_bytes),
            read_size: read_size.clamp(1, MAX_READ_BYTES),
            unread: Vec::new(),
            unread_start: 0,
            unwritten: Vec::new(),
            unwritten_start: 0,
            answers_unflushed: false,
            reading: Reading::Open,
            close_sent: false,
        }
    }

    fn queued_bytes(&self) -> usize {
        self.unwritten.len() - self.unwritten_start
    }

    /// Writes what is queued. `Ready(Ok)`: all of it was taken (and the queue's memory freed).
    fn poll_write_queued(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.unwritten_start < self.unwritten.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.unwritten[self.unwritten_start..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.unwritten_start += n;
        }
        self.unwritten = Vec::new();
        self.unwritten_start = 0;
        Poll::Ready(Ok(()))
    }

    /// Pushes on the answers the reading side wrote (pongs, a close): written and flushed as far
    /// as the socket takes them now. `Err`: the socket failed.
    fn push_answers(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if let Poll::Ready(Err(e)) = self.poll_write_queued(cx) {
            return Err(e);
        }
        if self.answers_unflushed && self.queued_bytes() == 0 {
            match Pin::new(&mut self.io).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.answers_unflushed = false,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => {}
            }
        }
        Ok(())
    }

    /// Queues an answer the protocol owes the client (a pong, a close) and starts writing it.
    fn answer(&mut self, cx: &mut Context<'_>, encode: impl FnOnce(&mut Vec<u8>)) {
        if self.close_sent {
            return;
        }
        encode(&mut self.unwritten);
        self.answers_unflushed = true;
        if self.push_answers(cx).is_err() {
            self.reading = Reading::Ended;
        }
    }

    /// The next message in the bytes already read, if they hold a whole one.
    fn decode_unread(&mut self) -> Option<Message> {
        loop {
            let (used, message) = self.decoder.decode(&mut self.unread[self.unread_start..])?;
            self.unread_start += used;
            if self.unread_start == self.unread.len() {
                // Nothing is held between frames.
                self.unread = Vec::new();
                self.unread_start = 0;
            }
            if message.is_some() {
                return message;
            }
        }
    }

    /// Reads more bytes from the socket into `unread`. `Ready(false)`: the socket ended or
    /// failed. The read goes into the stack: an idle connection, parked in this read, holds no
    /// buffer.
    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut scratch = [std::mem::MaybeUninit::<u8>::uninit(); MAX_READ_BYTES];
        let mut buf = ReadBuf::uninit(&mut scratch[..self.read_size]);
        match ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf)) {
            Ok(()) if !buf.filled().is_empty() => {
                if self.unread_start > 0 {
                    // Keep only the incomplete frame's bytes.
                    self.unread.drain(..self.unread_start);
                    self.unread_start = 0;
                }
                self.unread.extend_from_slice(buf.filled());
                Poll::Ready(true)
            }
            Ok(()) => Poll::Ready(false),
            Err(e) => {
                tracing::debug!(error = %e, "WebSocket read failed");
                Poll::Ready(false)
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Stream for WebSocketConnection<IO> {
    type Item = Inbound;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Inbound>> {
        let this = &mut *self;
        // Answers not taken at once (pongs to a client that reads slowly) go out while reading.
        if (this.queued_bytes() > 0 || this.answers_unflushed) && this.push_answers(cx).is_err() {
            this.reading = Reading::Ended;
        }
        loop {
            match this.reading {
                Reading::Open => {}
                Reading::Ended => return Poll::Ready(None),
                // `run_session` closes the connection after `TooLarge` and `Broken` and never
                // polls again; nothing needs to wake it.
                Reading::Stopped => return Poll::Pending,
            }
            if this.queued_bytes() >= ANSWERS_AHEAD_BYTES {
                // The socket refuses our answers (`push_answers` registered the wake-up): nothing
                // more is decoded or read until it takes them.
                return Poll::Pending;
            }
            let Some(message) = this.decode_unread() else {
                if !ready!(this.poll_read_more(cx)) {
                    this.reading = Reading::Ended;
                }
                continue;
            };
            return Poll::Ready(Some(match message {
                Message::Text(text) => Inbound::Text(text),
                Message::Binary => Inbound::Binary,
                Message::Ping(payload) => {
                    this.answer(cx, |out| ws_codec::encode(out, ws_codec::OP_PONG, &payload));
                    Inbound::Alive
                }
                Message::Pong => Inbound::Alive,
                Message::TooLarge => {
                    this.reading = Reading::Stopped;
                    Inbound::TooLarge
                }
                Message::Close(code) => {
                    // The closing handshake: the client's code echoed (RFC 6455 section 5.5.1).
                    this.answer(cx, |out| match code {
                        Some(code) => ws_codec::encode_close(out, code, ""),
                        None => ws_codec::encode(out, ws_codec::OP_CLOSE, b""),
                    });
                    this.close_sent = true;
                    this.reading = Reading::Ended;
                    return Poll::Ready(None);
                }
                // The session closes with the code (and logs and counts why).
                Message::Invalid(code, reason) => {
                    this.reading = Reading::Stopped;
                    Inbound::Broken(code, reason)
                }
            }));
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Sink<Outbound> for WebSocketConnection<IO> {
    type Error = io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.queued_bytes() >= WRITE_AHEAD_BYTES {
            ready!(self.poll_write_queued(cx))?;
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(mut self: Pin<&mut Self>, frame: Outbound) -> io::Result<()> {
        if self.close_sent {
            return Ok(());
        }
        let out = &mut self.unwritten;
        match frame {
            Outbound::Text(text) => ws_codec::encode(out, ws_codec::OP_TEXT, text.as_bytes()),
            Outbound::Shared(event) => ws_codec::encode(out, ws_codec::OP_TEXT, event.text.as_bytes()),
            Outbound::Ping => ws_codec::encode(out, ws_codec::OP_PING, b""),
            // Only a group's hub sends `SharedGone`, and no socket carries a hub.
            Outbound::SharedGone(..) => {}
            Outbound::Close(code, reason) => {
                ws_codec::encode_close(out, code, &reason);
                self.close_sent = true;
            }
        }
        Ok(())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_queued(cx))?;
        ready!(Pin::new(&mut self.io).poll_flush(cx))?;
        self.answers_unflushed = false;
        Poll::Ready(Ok(()))
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_flush(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
