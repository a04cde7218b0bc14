// A file for `ri2n recv`, or one from `ri2n send`, on loopback's two addresses:
//   ri2n recv --listen 127.0.0.1:7000 --output got.txt &
//   cargo run --release -p ri2n --example readme -- send 127.0.0.1:7000
// and the other way round:
//   cargo run --release -p ri2n --example readme -- recv 127.0.0.1:7000 > got.bin &
//   ri2n send --to 127.0.0.1:7000 --input big.iso
use std::io::{Read, Write};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (role, peer) = (args[1].as_str(), args[2].parse()?);
    if role == "send" {
        let locals = ["127.0.0.1:0".parse()?, "127.0.0.2:0".parse()?]; // one per network
        let client = ri2n::Endpoint::client(&locals)?;
        let mut conn = client.connect(&[peer], ri2n::ConnectionConfig::default())?;
        conn.write_all(b"hello")?; // a blocking byte stream (Read + Write)
        conn.finish()?; // the end of the stream...
        conn.wait_acknowledged(None)?; // ... and the receiver has every byte
    } else {
        // a server: without `.server()` an endpoint takes no connections
        let config = ri2n::EndpointConfig::new(vec![peer]).server();
        let server = ri2n::Endpoint::bind(config)?;
        let mut conn = server.accept()?;
        let mut data = Vec::new();
        conn.read_to_end(&mut data)?; // until the sender's end of stream
        std::io::stdout().write_all(&data)?;
    }
    Ok(())
}
