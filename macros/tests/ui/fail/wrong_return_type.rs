use distlock::distributed_lock;

#[distributed_lock("orders:{id}")]
async fn settle(id: u64) -> u64 {
    id
}

#[distributed_lock("orders:{id}")]
async fn nothing(id: u64) {
    let _ = id;
}

fn main() {}
