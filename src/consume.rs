//! `riffle consume`: read a results topic to its end, as a downstream reader of an exactly-once
//! run would (commit and fence markers applied), or raw.

use std::io::Write;

use anyhow::Result;
use riffle_connectors::kafka::committed::read_to_end;

use crate::cli::ConsumeArgs;

pub fn consume_command(args: ConsumeArgs) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let options = args.kafka.map();
    let summary = read_to_end(&args.brokers, &options, &args.topic, args.raw, |value| {
        out.write_all(value)?;
        out.write_all(b"\n")
    })?;
    out.flush()?;
    eprintln!(
        "{} result(s) of {} message(s){}",
        summary.shown,
        summary.messages,
        if args.raw {
            String::new()
        } else {
            format!("; {} uncommitted, held back", summary.uncommitted)
        }
    );
    Ok(())
}
