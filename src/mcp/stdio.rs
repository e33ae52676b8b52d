//! `sandpit mcp`: MCP over stdio — one JSON-RPC message per line on stdin, one answer per
//! line on stdout (nothing else is ever written there; logs go to stderr).

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use super::McpServer;

/// Longest message line accepted; a longer one is discarded and answered with a parse error.
pub const MAX_LINE: usize = 4 << 20;

/// A line read with a bound.
enum Line {
    Text(Vec<u8>),
    TooLong,
    Eof,
}

/// Read up to a newline without holding more than `MAX_LINE` bytes.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<Line> {
    let mut buf = Vec::new();
    let mut too_long = false;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if buf.is_empty() && !too_long {
                Line::Eof
            } else if too_long {
                Line::TooLong
            } else {
                Line::Text(buf)
            });
        }
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > MAX_LINE + 1 {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        r.consume(take);
        if done {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Text(buf)
            });
        }
    }
}

/// Serve MCP on a reader/writer pair until the reader ends.
pub async fn serve<R, W>(server: &McpServer, input: R, mut output: W) -> std::io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut input = input;
    loop {
        let answer = match read_line(&mut input).await? {
            Line::Eof => return Ok(()),
            Line::TooLong => Some(serde_json::json!({
                "jsonrpc": "2.0", "id": null,
                "error": { "code": -32700, "message": format!("message longer than {MAX_LINE} bytes") }
            })),
            Line::Text(t) => {
                if t.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                server.handle_bytes(&t).await
            }
        };
        if let Some(a) = answer {
            let mut line = serde_json::to_vec(&a).map_err(std::io::Error::other)?;
            line.push(b'\n');
            output.write_all(&line).await?;
            output.flush().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded() {
        let mut big = vec![b'x'; MAX_LINE + 10];
        big.push(b'\n');
        big.extend_from_slice(b"{}\n");
        let mut r = tokio::io::BufReader::new(&big[..]);
        assert!(matches!(read_line(&mut r).await, Ok(Line::TooLong)));
        assert!(matches!(read_line(&mut r).await, Ok(Line::Text(t)) if t == b"{}\n"));
        assert!(matches!(read_line(&mut r).await, Ok(Line::Eof)));
    }
}
