//! `spur-sim lab-heal`: how long after a network cut heals a real kernel delivers what an
//! open connection sent across it. The simulation holds what a partition or a freeze
//! catches and delivers it at the heal (`spur_judge::records::Cut`); a kernel delivers it at the
//! connection's next retransmission, whose timeout doubles from the first (at least
//! `TCP_RTO_MIN`, 200 ms) while the cut lasts. So the model is early by up to about the
//! cut's own length for a connection with data in flight, and never loses it (a dropping
//! model, turmoil's own, hangs that connection for good). This measures the kernel's side
//! and judges both claims: the data arrives, within one doubling of the cut.
//!
//! Each cut runs on a thread of its own in a network namespace of its own (a namespace
//! belongs to the thread that made it, and the `nft` it starts), so the cuts run at once
//! and nothing is left behind: the namespace goes with the thread.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;

/// The port the measured connection's server listens on, inside its own namespace.
const PORT: u16 = 7000;

#[derive(Debug, clap::Args)]
pub struct LabHealArgs {
    /// The cuts to measure, each on its own connection and all at once.
    #[arg(long, value_delimiter = ',', default_values = ["1s", "4s", "10s", "20s"],
          value_parser = humantime::parse_duration)]
    pub cuts: Vec<Duration>,
    /// One JSON object per cut instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// What one cut showed.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub cut: Duration,
    /// From the heal to the server's read of what was sent during the cut; `None`: it
    /// never arrived within a minute of the heal.
    pub after_heal: Option<Duration>,
}

impl Delivery {
    /// The kernel keeps the model's promise: what the cut held arrives, and within one
    /// doubling of the retransmission timeout past the heal (the cut's length, with a
    /// second for the first timeout and scheduling).
    pub fn as_modelled(&self) -> bool {
        self.after_heal
            .is_some_and(|d| d <= self.cut + Duration::from_secs(1))
    }
}

/// Measures every cut of `args` and prints them; `Ok(false)` when the kernel contradicts
/// the model (see [`Delivery::as_modelled`]).
pub fn main(args: LabHealArgs) -> anyhow::Result<bool> {
    if let Some(why) = super::kernel::missing_tools() {
        anyhow::bail!("lab-heal cannot run: {why}");
    }
    let threads: Vec<_> = args
        .cuts
        .iter()
        .map(|&cut| std::thread::spawn(move || measure(cut)))
        .collect();
    let mut all = true;
    if !args.json {
        println!(
            "| cut s | delivered after the heal s | model (at the heal) | within one doubling |"
        );
        println!("|---|---|---|---|");
    }
    for thread in threads {
        let delivery = thread
            .join()
            .map_err(|_| anyhow::anyhow!("a measuring thread panicked"))??;
        let ok = delivery.as_modelled();
        all &= ok;
        let after = delivery.after_heal.map(|d| d.as_secs_f64());
        if args.json {
            println!(
                "{}",
                json!({"cut_s": delivery.cut.as_secs_f64(), "after_heal_s": after, "as_modelled": ok})
            );
        } else {
            println!(
                "| {:.1} | {} | 0.0 | {} |",
                delivery.cut.as_secs_f64(),
                after.map_or("never".to_owned(), |s| format!("{s:.2}")),
                if ok { "yes" } else { "NO" }
            );
        }
    }
    Ok(all)
}

/// One cut of `cut` across an open connection with a write in flight, made and healed by
/// nftables in a private namespace; measured from the heal to the server's read.
pub fn measure(cut: Duration) -> anyhow::Result<Delivery> {
    super::kernel::enter_private_network()?;
    let listener = TcpListener::bind(("127.0.1.2", PORT))?;
    let mut client = TcpStream::connect(("127.0.1.2", PORT))?;
    let (mut server, _) = listener.accept()?;
    // One exchange first, so the connection has measured its round trip as a used one has.
    client.write_all(b"a")?;
    let mut byte = [0u8; 1];
    server.read_exact(&mut byte)?;
    nft(&format!(
        "table inet heal {{\n chain input {{\n  type filter hook input priority 0;\n  \
         tcp dport {PORT} drop\n  tcp sport {PORT} drop\n }}\n}}\n"
    ))?;
    client.write_all(b"b")?;
    std::thread::sleep(cut);
    nft("delete table inet heal")?;
    let healed = Instant::now();
    server.set_read_timeout(Some(Duration::from_secs(60)))?;
    let after_heal = match server.read_exact(&mut byte) {
        Ok(()) => Some(healed.elapsed()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Delivery { cut, after_heal })
}

fn nft(script: &str) -> std::io::Result<()> {
    super::kernel::run("nft", &["-f", "-"], Some(script))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_is_as_modelled_when_it_arrives_within_one_doubling() {
        let at = |cut: u64, after: Option<f64>| Delivery {
            cut: Duration::from_secs(cut),
            after_heal: after.map(Duration::from_secs_f64),
        };
        assert!(at(20, Some(5.4)).as_modelled());
        assert!(at(1, Some(0.4)).as_modelled());
        assert!(!at(20, Some(21.5)).as_modelled(), "later than one doubling");
        assert!(!at(20, None).as_modelled(), "lost");
    }
}
