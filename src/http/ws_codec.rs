//! The server side of RFC 6455's framing, without I/O: `Decoder` turns the bytes a client sent
//! into messages, `encode` writes the gateway's frames. `http::ws_connection` drives both over a
//! socket. Written here rather than taken from a crate: every WebSocket crate owns a read and a
//! write buffer per connection for the connection's whole life, and an idle session should hold
//! none (docs/performance.md, "Idle sessions").
//!
//! What a client may send: masked frames only; no reserved bits (no extension is negotiated);
//! text and binary messages, whole or in fragments, with control frames (ping, pong, close)
//! between the fragments; control frames of at most 125 bytes, never fragmented. Anything else
//! is a protocol error (close 1002); a text message that is not UTF-8, or a close reason that is
//! not, is 1007; a message over the size limit is reported as soon as its length is known.

use crate::core::protocol::close_code::{INVALID_DATA as CLOSE_INVALID_DATA, PROTOCOL_ERROR as CLOSE_PROTOCOL_ERROR};

pub const OP_CONTINUATION: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// The longest control frame payload (RFC 6455, section 5.5).
const MAX_CONTROL_PAYLOAD: usize = 125;

/// One thing the client said.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    Text(String),
    /// A binary message (not part of ackgate's protocol); its bytes are dropped.
    Binary,
    /// A ping, with the payload its pong must echo.
    Ping(Vec<u8>),
    Pong,
    /// The client's close frame, with its code if it gave one.
    Close(Option<u16>),
    /// A message over the size limit, reported once its length is known: nothing of the
    /// connection can be read after it.
    TooLarge,
    /// A frame that breaks the protocol: the connection is closed with this code and reason.
    Invalid(u16, &'static str),
}

/// Reads the frames of one connection. Holds nothing but a message in fragments, and that only
/// until its last fragment.
#[derive(Debug)]
pub struct Decoder {
    max_message_bytes: usize,
    /// A text or binary message whose first fragments came: its opcode and its text so far (a
    /// binary message's bytes are not kept: ackgate refuses them whole).
    fragments: Option<(u8, Vec<u8>)>,
    /// The bytes of those fragments, for the size limit.
    fragments_len: u64,
}

/// The parts of a frame's header that decide what happens to it.
struct Header {
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    header_len: usize,
    payload_len: u64,
}

impl Decoder {
    pub fn new(max_message_bytes: usize) -> Self {
        Self { max_message_bytes, fragments: None, fragments_len: 0 }
    }

    /// Decodes the first frame at the start of `buf` (unmasking it in place). `None`: the frame
    /// is not complete yet (read more and call again with the bytes appended). Otherwise the
    /// bytes the frame took, and the message it completed: `None` for a fragment that completes
    /// nothing yet. After `TooLarge` or `Invalid`, the bytes that follow mean nothing.
    pub fn decode(&mut self, buf: &mut [u8]) -> Option<(usize, Option<Message>)> {
        let header = match parse_header(buf) {
            Ok(Some(header)) => header,
            Ok(None) => return None,
            Err(reason) => return Some((0, Some(Message::Invalid(CLOSE_PROTOCOL_ERROR, reason)))),
        };
        if let Err(message) = self.check(&header) {
            return Some((0, Some(message)));
        }
        // `check` bounded the length by the limit, which is a usize.
        let payload_len = header.payload_len as usize;
        let total = header.header_len + payload_len;
        if buf.len() < total {
            return None;
        }
        let payload = &mut buf[header.header_len..total];
        unmask(payload, header.mask);
        Some((total, self.complete(header.fin, header.opcode, payload)))
    }

    /// The rules a frame's header alone can break, before its payload is waited for.
    fn check(&self, header: &Header) -> Result<(), Message> {
        let invalid = |reason| Err(Message::Invalid(CLOSE_PROTOCOL_ERROR, reason));
        match header.opcode {
            OP_CLOSE | OP_PING | OP_PONG => {
                if !header.fin {
                    return invalid("a fragmented control frame");
                }
                if header.payload_len > MAX_CONTROL_PAYLOAD as u64 {
                    return invalid("a control frame over 125 bytes");
                }
                Ok(())
            }
            OP_CONTINUATION | OP_TEXT | OP_BINARY => {
                let so_far = match (&self.fragments, header.opcode) {
                    (None, OP_CONTINUATION) => return invalid("a continuation frame without a message to continue"),
                    (Some(_), OP_TEXT | OP_BINARY) => return invalid("a new message before the last fragment of the previous one"),
                    (Some(_), _) => self.fragments_len,
                    (None, _) => 0,
                };
                if so_far.saturating_add(header.payload_len) > self.max_message_bytes as u64 {
                    return Err(Message::TooLarge);
                }
                Ok(())
            }
            _ => invalid("a reserved opcode"),
        }
    }

    /// What a whole frame (payload unmasked) completes.
    fn complete(&mut self, fin: bool, opcode: u8, payload: &[u8]) -> Option<Message> {
        match opcode {
            OP_PING => Some(Message::Ping(payload.to_vec())),
            OP_PONG => Some(Message::Pong),
            OP_CLOSE => Some(close_message(payload)),
            OP_BINARY if fin => Some(Message::Binary),
            OP_TEXT if fin => Some(data_message(opcode, payload.to_vec())),
            OP_TEXT | OP_BINARY => {
                self.fragments = Some((opcode, Vec::new()));
                self.fragments_len = 0;
                self.continue_message(fin, payload)
            }
            _ => self.continue_message(fin, payload),
        }
    }
}

impl Decoder {
    /// A fragment of the message in `fragments` (`check` made sure there is one).
    fn continue_message(&mut self, fin: bool, payload: &[u8]) -> Option<Message> {
        let (first, bytes) = self.fragments.as_mut()?;
        if *first == OP_TEXT {
            bytes.extend_from_slice(payload);
        }
        self.fragments_len += payload.len() as u64;
        if !fin {
            return None;
        }
        let (first, bytes) = self.fragments.take()?;
        Some(data_message(first, bytes))
    }
}

fn data_message(opcode: u8, bytes: Vec<u8>) -> Message {
    if opcode == OP_BINARY {
        return Message::Binary;
    }
    match String::from_utf8(bytes) {
        Ok(text) => Message::Text(text),
        Err(_) => Message::Invalid(CLOSE_INVALID_DATA, "a text message that is not UTF-8"),
    }
}

/// A client's close frame: no payload, or a valid code and a UTF-8 reason.
fn close_message(payload: &[u8]) -> Message {
    match payload {
        [] => Message::Close(None),
        [_] => Message::Invalid(CLOSE_PROTOCOL_ERROR, "a close frame with a one-byte payload"),
        [high, low, reason @ ..] => {
            let code = u16::from_be_bytes([*high, *low]);
            if !close_code_may_be_sent(code) {
                Message::Invalid(CLOSE_PROTOCOL_ERROR, "a close code that may not be sent")
            } else if std::str::from_utf8(reason).is_err() {
                Message::Invalid(CLOSE_INVALID_DATA, "a close reason that is not UTF-8")
            } else {
                Message::Close(Some(code))
            }
        }
    }
}

/// Codes an endpoint may put in a close frame (RFC 6455 section 7.4, and the IANA registry's
/// 1012-1014): 1004-1006 and 1015 are reserved for reports, never sent; below 1000 and from
/// 5000 on are no codes at all.
fn close_code_may_be_sent(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// The header at the start of `buf`: `Ok(None)` while it is incomplete.
fn parse_header(buf: &[u8]) -> Result<Option<Header>, &'static str> {
    let [first, second, rest @ ..] = buf else { return Ok(None) };
    if first & 0x70 != 0 {
        return Err("reserved bits set without an extension");
    }
    if second & 0x80 == 0 {
        return Err("an unmasked frame from a client");
    }
    let (payload_len, length_bytes) = match second & 0x7F {
        126 => match rest {
            [a, b, ..] => (u64::from(u16::from_be_bytes([*a, *b])), 2),
            _ => return Ok(None),
        },
        127 => match rest.get(..8) {
            Some(bytes) => {
                let len = u64::from_be_bytes(bytes.try_into().expect("8 bytes"));
                if len >> 63 != 0 {
                    return Err("a payload length with its most significant bit set");
                }
                (len, 8)
            }
            None => return Ok(None),
        },
        len => (u64::from(len), 0),
    };
    let Some(mask) = rest.get(length_bytes..length_bytes + 4) else { return Ok(None) };
    Ok(Some(Header { fin: first & 0x80 != 0, opcode: first & 0x0F, mask: mask.try_into().expect("4 bytes"), header_len: 2 + length_bytes + 4, payload_len }))
}

/// XORs the payload with the client's mask, eight bytes at a time where it can.
fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let wide = u64::from_ne_bytes([mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3]]);
    let mut chunks = payload.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let word = u64::from_ne_bytes((&*chunk).try_into().expect("8 bytes")) ^ wide;
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    // The tail starts at a multiple of 8, so the mask starts over at its first byte.
    for (i, byte) in chunks.into_remainder().iter_mut().enumerate() {
        *byte ^= mask[i % 4];
    }
}

/// Appends one unfragmented, unmasked server frame to `out`.
pub fn encode(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    out.push(0x80 | opcode);
    match payload.len() {
        len @ 0..=125 => out.push(len as u8),
        len @ 126..=0xFFFF => {
            out.push(126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            out.push(127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

/// Appends a close frame: the code, then as much of the reason as fits a control frame (cut at
/// a character boundary).
pub fn encode_close(out: &mut Vec<u8>, code: u16, reason: &str) {
    let mut end = reason.len().min(MAX_CONTROL_PAYLOAD - 2);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut payload = [0u8; MAX_CONTROL_PAYLOAD];
    payload[..2].copy_from_slice(&code.to_be_bytes());
    payload[2..2 + end].copy_from_slice(&reason.as_bytes()[..end]);
    encode(out, OP_CLOSE, &payload[..2 + end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client frame as a browser sends it: masked with `mask`.
    fn client_frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut frame = Vec::new();
        encode(&mut frame, opcode, payload);
        if !fin {
            frame[0] &= 0x7F;
        }
        frame[1] |= 0x80;
        let header_len = frame.len() - payload.len();
        let mut masked = payload.to_vec();
        unmask(&mut masked, mask);
        frame.truncate(header_len);
        frame.extend_from_slice(&mask);
        frame.extend_from_slice(&masked);
        frame
    }

    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        client_frame(fin, opcode, payload, [0x37, 0xFA, 0x21, 0x3D])
    }

    /// Every message in `bytes`, fed one byte at a time as the slowest network would, and the
    /// bytes left over.
    fn decode_all(decoder: &mut Decoder, bytes: &[u8]) -> (Vec<Message>, usize) {
        let mut messages = Vec::new();
        let mut buf = Vec::new();
        let mut left = 0;
        for byte in bytes {
            buf.push(*byte);
            while let Some((used, message)) = decoder.decode(&mut buf) {
                let stop = matches!(message, Some(Message::Invalid(..) | Message::TooLarge));
                messages.extend(message);
                if stop {
                    return (messages, bytes.len());
                }
                buf.drain(..used);
                if buf.is_empty() {
                    break;
                }
            }
            left = buf.len();
        }
        (messages, left)
    }

    #[test]
    fn whole_frames_of_every_length_form_decode() {
        for len in [0, 1, 7, 8, 9, 125, 126, 127, 65_535, 65_536, 100_000] {
            let text: String = "ab€".repeat(len / 5 + 1).chars().take(len).collect();
            let mut decoder = Decoder::new(1 << 20);
            let mut bytes = frame(true, OP_TEXT, text.as_bytes());
            let (used, message) = decoder.decode(&mut bytes).unwrap();
            assert_eq!(used, bytes.len(), "{len}");
            assert_eq!(message, Some(Message::Text(text)), "{len}");
        }
    }

    #[test]
    fn an_incomplete_frame_asks_for_more_at_every_cut() {
        let bytes = frame(true, OP_TEXT, "x".repeat(300).as_bytes());
        for cut in 0..bytes.len() {
            let mut partial = bytes[..cut].to_vec();
            assert_eq!(Decoder::new(1024).decode(&mut partial), None, "cut at {cut}");
        }
    }

    #[test]
    fn fragments_with_a_character_split_between_them_and_pings_between_them_form_one_message() {
        let text = "héllo wörld €";
        let bytes = text.as_bytes();
        // "é" is two bytes: the first fragment ends in its middle.
        let mut stream = frame(false, OP_TEXT, &bytes[..2]);
        stream.extend(frame(true, OP_PING, b"are you there"));
        stream.extend(frame(false, OP_CONTINUATION, &bytes[2..9]));
        stream.extend(frame(true, OP_PONG, b""));
        stream.extend(frame(false, OP_CONTINUATION, b""));
        stream.extend(frame(true, OP_CONTINUATION, &bytes[9..]));
        stream.extend(frame(true, OP_TEXT, b""));
        let (messages, left) = decode_all(&mut Decoder::new(1024), &stream);
        assert_eq!(messages, vec![Message::Ping(b"are you there".to_vec()), Message::Pong, Message::Text(text.into()), Message::Text(String::new())]);
        assert_eq!(left, 0);
    }

    #[test]
    fn binary_messages_whole_or_in_fragments_are_reported_without_their_bytes() {
        let mut stream = frame(true, OP_BINARY, &[0xFF, 0, 1]);
        stream.extend(frame(false, OP_BINARY, &[0xFF]));
        stream.extend(frame(true, OP_CONTINUATION, &[0xFE]));
        let (messages, _) = decode_all(&mut Decoder::new(1024), &stream);
        assert_eq!(messages, vec![Message::Binary, Message::Binary]);
    }

    #[test]
    fn text_that_is_not_utf8_is_1007_also_when_only_the_whole_message_shows_it() {
        let (messages, _) = decode_all(&mut Decoder::new(1024), &frame(true, OP_TEXT, &[b'a', 0xC3]));
        assert_eq!(messages, vec![Message::Invalid(CLOSE_INVALID_DATA, "a text message that is not UTF-8")]);
        // Each fragment alone could be the start of a valid message.
        let mut stream = frame(false, OP_TEXT, &[0xC3]);
        stream.extend(frame(true, OP_CONTINUATION, b"a"));
        let (messages, _) = decode_all(&mut Decoder::new(1024), &stream);
        assert_eq!(messages, vec![Message::Invalid(CLOSE_INVALID_DATA, "a text message that is not UTF-8")]);
    }

    #[test]
    fn protocol_errors_are_1002() {
        let mut unmasked = Vec::new();
        encode(&mut unmasked, OP_TEXT, b"hi");
        let mut reserved = frame(true, OP_TEXT, b"hi");
        reserved[0] |= 0x40;
        let mut huge_length = frame(true, OP_BINARY, b"");
        huge_length.truncate(1);
        huge_length.extend([0xFF, 0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]);
        let mut fragmented_then_new = frame(false, OP_TEXT, b"a");
        fragmented_then_new.extend(frame(true, OP_TEXT, b"b"));
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("unmasked", unmasked),
            ("reserved bit", reserved),
            ("reserved opcode 3", frame(true, 0x3, b"")),
            ("reserved opcode 0xB", frame(true, 0xB, b"")),
            ("continuation first", frame(true, OP_CONTINUATION, b"a")),
            ("new message among fragments", fragmented_then_new),
            ("fragmented ping", frame(false, OP_PING, b"")),
            ("ping over 125", frame(true, OP_PING, &[0; 126])),
            ("close with one byte", frame(true, OP_CLOSE, &[3])),
            ("close code 1005", frame(true, OP_CLOSE, &1005u16.to_be_bytes())),
            ("close code 999", frame(true, OP_CLOSE, &999u16.to_be_bytes())),
            ("close code 5000", frame(true, OP_CLOSE, &5000u16.to_be_bytes())),
            ("length with the top bit", huge_length),
        ];
        for (name, bytes) in cases {
            let (messages, _) = decode_all(&mut Decoder::new(1 << 20), &bytes);
            assert!(matches!(messages.last(), Some(Message::Invalid(CLOSE_PROTOCOL_ERROR, _))), "{name}: {messages:?}");
        }
    }

    #[test]
    fn close_frames_with_and_without_a_code() {
        let mut with_reason = 4001u16.to_be_bytes().to_vec();
        with_reason.extend("bye ✓".as_bytes());
        let mut bad_reason = 1000u16.to_be_bytes().to_vec();
        bad_reason.push(0xFF);
        let cases = [
            (frame(true, OP_CLOSE, b""), Message::Close(None)),
            (frame(true, OP_CLOSE, &1000u16.to_be_bytes()), Message::Close(Some(1000))),
            (frame(true, OP_CLOSE, &with_reason), Message::Close(Some(4001))),
            (frame(true, OP_CLOSE, &bad_reason), Message::Invalid(CLOSE_INVALID_DATA, "a close reason that is not UTF-8")),
        ];
        for (bytes, expected) in cases {
            assert_eq!(decode_all(&mut Decoder::new(1024), &bytes).0, vec![expected]);
        }
    }

    #[test]
    fn a_message_over_the_limit_is_reported_from_its_header_alone() {
        let mut header_only = frame(true, OP_TEXT, &[b'x'; 2000]);
        header_only.truncate(8);
        assert_eq!(Decoder::new(1024).decode(&mut header_only), Some((0, Some(Message::TooLarge))));
        // 2^64-1 and 2^63 as announced lengths: refused, never added or allocated.
        for (len, too_large) in [(u64::MAX, false), (1 << 63, false), ((1 << 63) - 1, true)] {
            let mut bytes = vec![0x81, 0xFF];
            bytes.extend(len.to_be_bytes());
            bytes.extend([1, 2, 3, 4]);
            let decoded = Decoder::new(1024).decode(&mut bytes);
            let expected =
                if too_large { Message::TooLarge } else { Message::Invalid(CLOSE_PROTOCOL_ERROR, "a payload length with its most significant bit set") };
            assert_eq!(decoded, Some((0, Some(expected))), "{len}");
        }
        // Fragments count together.
        let mut stream = frame(false, OP_TEXT, &[b'x'; 600]);
        stream.extend(frame(true, OP_CONTINUATION, &[b'x'; 600]));
        assert_eq!(decode_all(&mut Decoder::new(1024), &stream).0, vec![Message::TooLarge]);
        // Exactly at the limit is fine.
        let (messages, _) = decode_all(&mut Decoder::new(1024), &frame(true, OP_TEXT, &[b'x'; 1024]));
        assert_eq!(messages, vec![Message::Text("x".repeat(1024))]);
    }

    #[test]
    fn unmasking_matches_the_bytewise_definition_at_every_length_and_mask() {
        for len in 0..40 {
            let payload: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37)).collect();
            let mask = [0xA1, 0x02, 0x7F, 0xEE];
            let mut fast = payload.clone();
            unmask(&mut fast, mask);
            let slow: Vec<u8> = payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]).collect();
            assert_eq!(fast, slow, "{len}");
        }
    }

    #[test]
    fn server_frames_use_the_shortest_length_form_and_close_reasons_are_cut_at_a_character() {
        for (len, header) in [(0, 2), (125, 2), (126, 4), (65_535, 4), (65_536, 10)] {
            let mut out = Vec::new();
            encode(&mut out, OP_TEXT, &vec![b'a'; len]);
            assert_eq!(out.len(), header + len, "{len}");
            assert_eq!(out[0], 0x81);
        }
        let mut out = Vec::new();
        encode_close(&mut out, 1009, &"€".repeat(100));
        let payload = &out[2..];
        assert!(payload.len() <= 125);
        assert_eq!(&payload[..2], &1009u16.to_be_bytes());
        assert!(std::str::from_utf8(&payload[2..]).is_ok());
        assert_eq!(payload.len(), 2 + 123 / 3 * 3);
    }
}
