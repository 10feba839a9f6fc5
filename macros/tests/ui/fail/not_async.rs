use distlock::distributed_lock;

#[distributed_lock("orders:{id}")]
fn settle(id: u64) -> Result<(), distlock::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
