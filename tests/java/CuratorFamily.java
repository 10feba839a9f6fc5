// Curator 5's read-write lock and semaphores driven line by line over stdin, for the interop
// tests:
//   args: <connect string> <lock path> rw | sem <max leases> | semmutex
//   rw:       "read" / "write" -> GOT, "tryread <ms>" / "trywrite <ms>" -> GOT | BUSY,
//             "unread" / "unwrite" -> RELEASED,
//             "downgrade55" -> DOWNGRADED: the layout Curator >= 5.5 writes for a downgrade
//             (CURATOR-621: a protected EPHEMERAL "__READ__<write sequence>" node, then the write
//             node deleted), written here through the framework because Debian ships 5.4;
//             "undowngrade" -> RELEASED deletes that read node
//   sem:      "acquire <n>" -> GOT, "try <n> <ms>" -> GOT | BUSY, "release" -> RELEASED (all)
//   semmutex: "lock" -> GOT, "try <ms>" -> GOT | BUSY, "release" -> RELEASED
//   any:      "quit" -> BYE
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.zookeeper.CreateMode;

public class CuratorFamily {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = Curators.connect(args[0]);
        String path = args[1];
        String kind = args[2];
        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
        InterProcessSemaphoreV2 sem = kind.equals("sem")
            ? new InterProcessSemaphoreV2(client, path, Integer.parseInt(args[3])) : null;
        InterProcessSemaphoreMutex semMutex = new InterProcessSemaphoreMutex(client, path);
        List<Lease> leases = new ArrayList<>();
        String downgraded = null;
        System.out.println("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split(" ");
            String out;
            switch (cmd[0]) {
                case "read": rw.readLock().acquire(); out = "GOT"; break;
                case "write": rw.writeLock().acquire(); out = "GOT"; break;
                case "tryread":
                    out = rw.readLock().acquire(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS) ? "GOT" : "BUSY";
                    break;
                case "trywrite":
                    out = rw.writeLock().acquire(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS) ? "GOT" : "BUSY";
                    break;
                case "unread": rw.readLock().release(); out = "RELEASED"; break;
                case "unwrite": rw.writeLock().release(); out = "RELEASED"; break;
                case "downgrade55": {
                    // Sorted in lock order: the holder's (ours) comes first.
                    String write = rw.writeLock().getParticipantNodes().iterator().next();
                    String seq = write.substring(write.lastIndexOf("__WRIT__") + 8);
                    downgraded = client.create().withProtection().withMode(CreateMode.EPHEMERAL)
                        .forPath(path + "/__READ__" + seq);
                    rw.writeLock().release();
                    out = "DOWNGRADED";
                    break;
                }
                case "undowngrade":
                    client.delete().forPath(downgraded);
                    out = "RELEASED";
                    break;
                case "acquire":
                    leases.addAll(sem.acquire(Integer.parseInt(cmd[1])));
                    out = "GOT";
                    break;
                case "try": {
                    if (kind.equals("semmutex")) {
                        out = semMutex.acquire(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS) ? "GOT" : "BUSY";
                    } else {
                        Collection<Lease> got = sem.acquire(Integer.parseInt(cmd[1]), Long.parseLong(cmd[2]), TimeUnit.MILLISECONDS);
                        if (got == null) {
                            out = "BUSY";
                        } else {
                            leases.addAll(got);
                            out = "GOT";
                        }
                    }
                    break;
                }
                case "lock": semMutex.acquire(); out = "GOT"; break;
                case "release":
                    if (kind.equals("semmutex")) {
                        semMutex.release();
                    } else {
                        sem.returnAll(leases);
                        leases.clear();
                    }
                    out = "RELEASED";
                    break;
                case "quit":
                    client.close();
                    System.out.println("BYE");
                    return;
                default: out = "UNKNOWN " + line;
            }
            System.out.println(out);
        }
        client.close();
    }
}
