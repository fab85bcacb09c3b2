//! SPDY/3.1 framing, the part of it that kubectl's port-forward speaks (tunnelled in
//! WebSocket messages since kubectl 1.31, over a raw upgraded connection before): control
//! frames SYN_STREAM, SYN_REPLY, RST_STREAM, PING and GOAWAY, and data frames.
//!
//! Header blocks are zlib-compressed with SPDY's preset dictionary, one compression stream
//! a direction for the whole connection, so a [`Codec`] keeps both streams. Flow control
//! (WINDOW_UPDATE, SETTINGS) is read and ignored, as Go's spdystream does on both ends.

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

/// SPDY's version in every control frame.
const VERSION: u16 = 3;
/// A frame's header: a control bit, version and type (or a stream id), flags, length.
const HEADER_LEN: usize = 8;
/// A data or SYN_STREAM frame's flag: the sender sends nothing more on the stream.
pub(crate) const FLAG_FIN: u8 = 0x01;
/// The largest frame taken (the length field's 24 bits); a larger one is a protocol error.
const MAX_FRAME: usize = 0xff_ffff;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;

/// A frame as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// The peer opened `stream` with `headers` (names lower-case, as SPDY requires).
    SynStream {
        stream: u32,
        headers: Vec<(String, String)>,
    },
    /// Bytes on `stream`; `fin` when the peer sends nothing more on it.
    Data { stream: u32, fin: bool, data: Bytes },
    /// The peer ended `stream` abruptly.
    RstStream { stream: u32 },
    /// A ping to echo.
    Ping(u32),
    /// The peer ends the connection.
    GoAway,
    /// A frame this server has no use for (SETTINGS, WINDOW_UPDATE, HEADERS, ...).
    Ignored,
}

/// Why the peer's bytes are not SPDY/3.1.
#[derive(Debug, thiserror::Error)]
#[error("SPDY: {0}")]
pub(crate) struct SpdyError(String);

/// The state of one connection's framing: bytes not yet framed, and the two header
/// compression streams.
pub(crate) struct Codec {
    buffer: BytesMut,
    inflate: Decompress,
    deflate: Compress,
    dictionary: Vec<u8>,
}

impl Codec {
    pub(crate) fn new() -> Self {
        let dictionary = dictionary();
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(&dictionary)
            .expect("a fresh compressor takes a dictionary");
        Self {
            buffer: BytesMut::new(),
            inflate: Decompress::new(true),
            deflate,
            dictionary,
        }
    }

    /// Takes bytes the peer sent.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole frame fed, if one is.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Frame>, SpdyError> {
        if self.buffer.len() < HEADER_LEN {
            return Ok(None);
        }
        let first = u32::from_be_bytes(self.buffer[0..4].try_into().expect("four bytes"));
        let flags = self.buffer[4];
        let length =
            u32::from_be_bytes([0, self.buffer[5], self.buffer[6], self.buffer[7]]) as usize;
        if length > MAX_FRAME {
            return Err(SpdyError(format!("a frame of {length} bytes")));
        }
        if self.buffer.len() < HEADER_LEN + length {
            return Ok(None);
        }
        self.buffer.advance(HEADER_LEN);
        let mut payload = self.buffer.split_to(length).freeze();
        if first & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                stream: first & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                data: payload,
            }));
        }
        let word = |payload: &mut Bytes| -> Result<u32, SpdyError> {
            (payload.len() >= 4)
                .then(|| payload.get_u32())
                .ok_or_else(|| SpdyError("a control frame cut short".to_owned()))
        };
        let frame = match (first & 0xffff) as u16 {
            TYPE_SYN_STREAM => {
                let stream = word(&mut payload)? & 0x7fff_ffff;
                // The associated stream, priority and slot: nothing here uses them.
                word(&mut payload)?;
                if payload.len() < 2 {
                    return Err(SpdyError("a SYN_STREAM cut short".to_owned()));
                }
                payload.advance(2);
                let block = self.inflate(&payload)?;
                Frame::SynStream {
                    stream,
                    headers: parse_block(&block)?,
                }
            }
            TYPE_RST_STREAM => Frame::RstStream {
                stream: word(&mut payload)? & 0x7fff_ffff,
            },
            TYPE_PING => Frame::Ping(word(&mut payload)?),
            TYPE_GOAWAY => Frame::GoAway,
            TYPE_SYN_REPLY => {
                // Its header block still moves the peer's compression stream on.
                word(&mut payload)?;
                self.inflate(&payload)?;
                Frame::Ignored
            }
            _ => Frame::Ignored,
        };
        Ok(Some(frame))
    }

    /// Decompresses one header block, which continues the peer's compression stream.
    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        let mut consumed = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity());
            }
            let (in_before, out_before) = (self.inflate.total_in(), self.inflate.total_out());
            let result =
                self.inflate
                    .decompress_vec(&input[consumed..], &mut out, FlushDecompress::Sync);
            consumed += (self.inflate.total_in() - in_before) as usize;
            match result {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&self.dictionary)
                        .map_err(|e| SpdyError(format!("the header dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(SpdyError(format!("a header block: {e}"))),
            }
            let progressed = self.inflate.total_out() > out_before || consumed > 0;
            if (consumed == input.len() && out.len() < out.capacity()) || !progressed {
                return Ok(out);
            }
        }
    }

    /// The answer to the peer's SYN_STREAM on `stream`: a SYN_REPLY with no headers.
    pub(crate) fn syn_reply(&mut self, stream: u32) -> Bytes {
        let block = self.deflate(&0u32.to_be_bytes());
        let mut payload = BytesMut::with_capacity(4 + block.len());
        payload.put_u32(stream & 0x7fff_ffff);
        payload.put_slice(&block);
        control(TYPE_SYN_REPLY, 0, &payload)
    }

    /// Compresses one header block on this side's compression stream (sync-flushed, so
    /// the block ends within its frame).
    fn deflate(&mut self, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(input.len() + 64);
        let mut consumed = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity());
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&input[consumed..], &mut out, FlushCompress::Sync)
                .expect("compressing into memory does not fail");
            consumed += (self.deflate.total_in() - before) as usize;
            if consumed == input.len() && out.len() < out.capacity() {
                return out;
            }
        }
    }
}

/// A data frame on `stream` (`fin`: the last this side sends on it).
pub(crate) fn data(stream: u32, fin: bool, bytes: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(HEADER_LEN + bytes.len());
    frame.put_u32(stream & 0x7fff_ffff);
    frame.put_u8(if fin { FLAG_FIN } else { 0 });
    frame.put_uint(bytes.len() as u64, 3);
    frame.put_slice(bytes);
    frame.freeze()
}

/// A PING frame with `id` (a received ping is answered with its own id).
pub(crate) fn ping(id: u32) -> Bytes {
    control(TYPE_PING, 0, &id.to_be_bytes())
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(HEADER_LEN + payload.len());
    frame.put_u16(0x8000 | VERSION);
    frame.put_u16(kind);
    frame.put_u8(flags);
    frame.put_uint(payload.len() as u64, 3);
    frame.put_slice(payload);
    frame.freeze()
}

/// A decompressed header block: a count, then each name and value after its length.
fn parse_block(block: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
    let mut rest = block;
    let field = |rest: &mut &[u8]| -> Result<String, SpdyError> {
        let short = || SpdyError("a header block cut short".to_owned());
        let len = rest.get(..4).ok_or_else(short)?;
        let len = u32::from_be_bytes(len.try_into().expect("four bytes")) as usize;
        let text = rest.get(4..4 + len).ok_or_else(short)?;
        let text = String::from_utf8_lossy(text).into_owned();
        *rest = &rest[4 + len..];
        Ok(text)
    };
    let count = rest
        .get(..4)
        .map(|c| u32::from_be_bytes(c.try_into().expect("four bytes")))
        .ok_or_else(|| SpdyError("an empty header block".to_owned()))?;
    rest = &rest[4..];
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = field(&mut rest)?;
        let value = field(&mut rest)?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// SPDY/3's header dictionary: its words, each after its length, then its tail text.
fn dictionary() -> Vec<u8> {
    let mut out = Vec::with_capacity(1423);
    for word in DICTIONARY_WORDS {
        out.extend_from_slice(&(word.len() as u32).to_be_bytes());
        out.extend_from_slice(word.as_bytes());
    }
    for part in DICTIONARY_TAIL {
        out.extend_from_slice(part.as_bytes());
    }
    out
}

/// The words of SPDY/3's header dictionary, each written into it after its length (four
/// bytes, big-endian).
const DICTIONARY_WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's text after its words: status lines, dates, media types.
const DICTIONARY_TAIL: &[&str] = &[
    "10010120120220520630030230330430530630740240540640740840941041141241341441541641",
    "7502504505203 Non-Authoritative Information204 No Content301 Moved Permanently40",
    "0 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept O",
    "ct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,imag",
    "e/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/",
    "javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1",
    ",utf-,*,enq=0.",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    fn syn_stream(stream: u32, block: &[u8]) -> Bytes {
        let mut payload = BytesMut::new();
        payload.put_u32(stream);
        payload.put_u32(0);
        payload.put_u16(0);
        payload.put_slice(block);
        control(TYPE_SYN_STREAM, 0, &payload)
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        let dict = dictionary();
        assert_eq!(dict.len(), 1423);
        let mut check = Decompress::new(true);
        // A zlib stream made with SPDY's dictionary names it by its Adler-32, 0xe3c6a7c2.
        let mut sink = Vec::with_capacity(16);
        let err = check
            .decompress_vec(&unhex("78bbe3c6a7c2"), &mut sink, FlushDecompress::Sync)
            .unwrap_err();
        assert_eq!(err.needs_dictionary(), Some(0xe3c6_a7c2));
        assert_eq!(check.set_dictionary(&dict).unwrap(), 0xe3c6_a7c2);
    }

    /// Two header blocks as zlib (with SPDY's dictionary) compresses them on one stream,
    /// as kubectl's port-forward opens its error and data streams.
    #[test]
    fn syn_streams_read_across_one_compression_stream() {
        let first = unhex(
            "78bbe3c6a7c202253a48f95b044eea16061606409ab308125f99a074cc68004e892545a989b9d0c2863515141500000000ffff",
        );
        let second = unhex("225333a8a44a04000000ffff");
        let mut codec = Codec::new();
        codec.feed(&syn_stream(1, &first));
        codec.feed(&syn_stream(3, &second)[..10]);
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            codec.next_frame().unwrap(),
            Some(Frame::SynStream {
                stream: 1,
                headers: pairs(&[
                    ("port", "8080"),
                    ("requestid", "0"),
                    ("streamtype", "error")
                ])
            })
        );
        assert_eq!(codec.next_frame().unwrap(), None, "half a frame waits");
        codec.feed(&syn_stream(3, &second)[10..]);
        assert_eq!(
            codec.next_frame().unwrap(),
            Some(Frame::SynStream {
                stream: 3,
                headers: pairs(&[("port", "8080"), ("requestid", "0"), ("streamtype", "data")])
            })
        );
    }

    #[test]
    fn replies_and_data_read_back() {
        let mut ours = Codec::new();
        let mut theirs = Codec::new();
        theirs.feed(&ours.syn_reply(1));
        theirs.feed(&ours.syn_reply(3));
        theirs.feed(&data(3, true, b"hello"));
        theirs.feed(&ping(2));
        assert_eq!(theirs.next_frame().unwrap(), Some(Frame::Ignored));
        assert_eq!(theirs.next_frame().unwrap(), Some(Frame::Ignored));
        assert_eq!(
            theirs.next_frame().unwrap(),
            Some(Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::from_static(b"hello")
            })
        );
        assert_eq!(theirs.next_frame().unwrap(), Some(Frame::Ping(2)));
    }
}
