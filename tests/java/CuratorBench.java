// The contention workload on Curator 5's InterProcessMutex, for benches/contention.rs:
//   args: <connect string> <lock path> <workers> <cs_ms> <secs>
// W threads, each with its own CuratorFramework (own session), loop acquire / hold cs_ms /
// release for secs seconds. Prints the standard line (server_ops_per_acq=n/a: the Rust side
// fills it in from mntr) followed by " acquisitions=N".
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorBench {
    public static void main(String[] args) throws Exception {
        String connect = args[0];
        String path = args[1];
        int workers = Integer.parseInt(args[2]);
        double csMs = Double.parseDouble(args[3]);
        double secs = Double.parseDouble(args[4]);
        long csNanos = (long) (csMs * 1e6);

        List<CuratorFramework> clients = new ArrayList<>();
        for (int i = 0; i < workers; i++) {
            CuratorFramework c = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(10000)
                .retryPolicy(new RetryNTimes(3, 100))
                .build();
            c.start();
            c.blockUntilConnected(20, TimeUnit.SECONDS);
            clients.add(c);
        }
        AtomicBoolean stop = new AtomicBoolean(false);
        AtomicInteger inside = new AtomicInteger();
        AtomicInteger overlaps = new AtomicInteger();
        List<List<Long>> waits = new ArrayList<>();
        Thread[] threads = new Thread[workers];
        for (int i = 0; i < workers; i++) {
            List<Long> mine = new ArrayList<>();
            waits.add(mine);
            InterProcessMutex mutex = new InterProcessMutex(clients.get(i), path);
            threads[i] = new Thread(() -> {
                try {
                    while (!stop.get()) {
                        long asked = System.nanoTime();
                        mutex.acquire();
                        mine.add(System.nanoTime() - asked);
                        if (inside.incrementAndGet() != 1) overlaps.incrementAndGet();
                        if (csNanos > 0) {
                            long until = System.nanoTime() + csNanos;
                            if (csNanos > 200_000) LockSupport.parkNanos(csNanos - 200_000);
                            while (System.nanoTime() < until) Thread.onSpinWait();
                        }
                        inside.decrementAndGet();
                        mutex.release();
                    }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
        }
        long start = System.nanoTime();
        for (Thread t : threads) t.start();
        Thread.sleep((long) (secs * 1000));
        stop.set(true);
        for (Thread t : threads) t.join();
        double elapsed = (System.nanoTime() - start) / 1e9;
        for (CuratorFramework c : clients) c.close();

        List<Long> all = new ArrayList<>();
        int min = Integer.MAX_VALUE, max = 0;
        for (List<Long> w : waits) {
            all.addAll(w);
            min = Math.min(min, w.size());
            max = Math.max(max, w.size());
        }
        Collections.sort(all);
        int n = all.size();
        System.out.printf(
            "curator workers=%d cs_ms=%s acq_per_s=%.0f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f fairness_min_over_max=%.2f server_ops_per_acq=n/a overlaps=%d acquisitions=%d%n",
            workers, fmt(csMs), n / elapsed, pct(all, 0.50), pct(all, 0.99),
            n == 0 ? 0.0 : all.get(n - 1) / 1e6, max == 0 ? 0.0 : (double) min / max,
            overlaps.get(), n);
    }

    static double pct(List<Long> sorted, double p) {
        if (sorted.isEmpty()) return 0.0;
        int i = (int) Math.min(sorted.size() - 1, Math.round(p * (sorted.size() - 1)));
        return sorted.get(i) / 1e6;
    }

    static String fmt(double d) {
        return d == Math.rint(d) ? String.valueOf((long) d) : String.valueOf(d);
    }
}
