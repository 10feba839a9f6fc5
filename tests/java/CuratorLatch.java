// A Curator 5 LeaderLatch driven line by line over stdin, for the election interop tests:
//   args: <connect string> <latch path> <participant id>
//   stdin: "start" -> STARTED (a new latch; its node is made in the background),
//          "await <ms>" -> LEADER | FOLLOWER, "leading" -> YES | NO,
//          "leader" -> LEADER <id> | NONE (getLeader(), as any participant reads it),
//          "close" -> CLOSED,
//          "cycle <n> <hold ms>" -> n times: a new latch, start, await, hold, close; prints
//            "HELD <from> <to>" (wall clock, microseconds since the epoch: from just after
//            await returned, to just before close) each time, then DONE,
//          "quit" -> BYE
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Instant;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;

public class CuratorLatch {
    static long micros() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000L;
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = Curators.connect(args[0]);
        String path = args[1];
        String id = args[2];
        LeaderLatch latch = null;
        System.out.println("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] cmd = line.trim().split(" ");
            switch (cmd[0]) {
                case "start":
                    latch = new LeaderLatch(client, path, id);
                    latch.start();
                    System.out.println("STARTED");
                    break;
                case "await":
                    boolean leads = latch.await(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS);
                    System.out.println(leads ? "LEADER" : "FOLLOWER");
                    break;
                case "leading":
                    System.out.println(latch != null && latch.hasLeadership() ? "YES" : "NO");
                    break;
                case "leader": {
                    // Any participant (or none) reads the leader the same way.
                    LeaderLatch reader = latch != null ? latch : new LeaderLatch(client, path, id);
                    Participant leader = reader.getLeader();
                    System.out.println(leader.isLeader() ? "LEADER " + leader.getId() : "NONE");
                    break;
                }
                case "close":
                    latch.close();
                    latch = null;
                    System.out.println("CLOSED");
                    break;
                case "cycle": {
                    int n = Integer.parseInt(cmd[1]);
                    long hold = Long.parseLong(cmd[2]);
                    for (int i = 0; i < n; i++) {
                        LeaderLatch turn = new LeaderLatch(client, path, id);
                        turn.start();
                        turn.await();
                        long from = micros();
                        if (hold > 0) {
                            Thread.sleep(hold);
                        }
                        long to = micros();
                        turn.close();
                        System.out.println("HELD " + from + " " + to);
                    }
                    System.out.println("DONE");
                    break;
                }
                case "quit":
                    if (latch != null) {
                        latch.close();
                    }
                    client.close();
                    System.out.println("BYE");
                    return;
                default:
                    System.out.println("UNKNOWN " + line);
            }
        }
        client.close();
    }
}
