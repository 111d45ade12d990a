// The Java side of `walkit bench bookkeeper` (walkit/bench/_bookkeeper_java.py): the
// Apache BookKeeper 4.18.2 Java client running the benchmark's workloads in its own JVM.
// Arguments: the metadata service URI, then the client settings as one JSON object
// ({"throttle": int, "v2": bool, "explicit_lac_ms": int}). Then one JSON command per line
// on stdin, one JSON answer per line on stdout; logs go to stderr. Every timed command
// reports the CPU ticks (/proc/<pid>/stat utime + stime) of this JVM and of the processes
// in "pids" over its counted interval only. Errors: {"error": "<name>", "message": ...}.
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.api.BookKeeper;
import org.apache.bookkeeper.client.api.DigestType;
import org.apache.bookkeeper.client.api.LastConfirmedAndEntry;
import org.apache.bookkeeper.client.api.LedgerEntries;
import org.apache.bookkeeper.client.api.LedgerEntry;
import org.apache.bookkeeper.client.api.ReadHandle;
import org.apache.bookkeeper.client.api.WriteHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

public class BenchPeer {
    static final ObjectMapper JSON = new ObjectMapper();
    static final byte[] PASSWORD = new byte[0];
    static PrintStream out;
    static BookKeeper bk;
    static BookKeeper readerBk;  // the tailing reader's own client (v3 protocol: long polls), as a reader elsewhere would have
    static boolean parallelLongPoll;

    public static void main(String[] args) throws Exception {
        out = new PrintStream(System.out, true, "UTF-8");
        System.setOut(System.err);  // before any BookKeeper class logs to "stdout"
        JsonNode settings = JSON.readTree(args[1]);
        bk = client(args[0], settings, settings.path("v2").asBoolean(false));
        readerBk = client(args[0], settings, false);  // long polls exist in the v3 protocol only
        parallelLongPoll = settings.path("parallel_long_poll").asBoolean(false);
        out.println(JSON.writeValueAsString(JSON.createObjectNode().put("ready", true)));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            ObjectNode result;
            try {
                result = run(JSON.readTree(line));
            } catch (Throwable t) {
                result = error(t);
            }
            out.println(JSON.writeValueAsString(result));
        }
        out.flush();
        Runtime.getRuntime().halt(0);  // bk.close() waits seconds for Netty's quiet period
    }

    static BookKeeper client(String uri, JsonNode settings, boolean v2) throws Exception {
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(uri);
        if (settings.has("throttle")) conf.setThrottleValue(settings.get("throttle").asInt());
        if (v2) conf.setUseV2WireProtocol(true);
        if (settings.has("explicit_lac_ms")) conf.setExplictLacInterval(settings.get("explicit_lac_ms").asInt());
        return BookKeeper.newBuilder(conf).build();
    }

    static ObjectNode error(Throwable t) {
        while ((t instanceof ExecutionException || t instanceof java.util.concurrent.CompletionException)
                && t.getCause() != null) {
            t = t.getCause();
        }
        String name = t instanceof BKException
                ? BKException.codeLogger(((BKException) t).getCode()).toString() : t.getClass().getSimpleName();
        return JSON.createObjectNode().put("error", name).put("message", String.valueOf(t.getMessage()));
    }

    static ObjectNode run(JsonNode cmd) throws Exception {
        switch (cmd.path("op").asText()) {
            case "sequential": return sequential(cmd);
            case "pipelined": return pipelined(cmd);
            case "write": return write(cmd);
            case "read": return read(cmd);
            case "tail": return tail(cmd);
            case "ledgers": return ledgers(cmd);
            default: return JSON.createObjectNode().put("error", "UnknownCommand").put("message", cmd.toString());
        }
    }

    // --- CPU from /proc ------------------------------------------------------------------
    static long ticks(String pid) {
        try {
            String stat = new String(Files.readAllBytes(Paths.get("/proc/" + pid + "/stat")), StandardCharsets.US_ASCII);
            String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
            return Long.parseLong(f[11]) + Long.parseLong(f[12]);  // utime, stime (fields 14, 15)
        } catch (Exception e) {
            throw new IllegalStateException("cannot read /proc/" + pid + "/stat", e);
        }
    }

    /** The whole machine's busy (user, nice, system, irq, softirq) and stolen ticks, from /proc/stat. */
    static long[] machine() {
        try {
            String line = Files.readAllLines(Paths.get("/proc/stat")).get(0);
            String[] f = line.trim().split("\\s+");
            long busy = Long.parseLong(f[1]) + Long.parseLong(f[2]) + Long.parseLong(f[3]) + Long.parseLong(f[6])
                    + Long.parseLong(f[7]);
            return new long[] {busy, Long.parseLong(f[8])};
        } catch (Exception e) {
            throw new IllegalStateException("cannot read /proc/stat", e);
        }
    }

    /** CPU ticks of this JVM, of the processes in cmd.pids and of the machine, and the wall clock. */
    static final class Meter {
        final List<String> pids = new ArrayList<>();
        long t0, self0, others0;
        long[] machine0;

        Meter(JsonNode cmd) {
            for (JsonNode p : cmd.path("pids")) pids.add(p.asText());
        }

        long others() {
            long sum = 0;
            for (String p : pids) sum += ticks(p);
            return sum;
        }

        void start() {
            machine0 = machine();
            self0 = ticks("self");
            others0 = others();
            t0 = System.nanoTime();
        }

        ObjectNode stop(long entries) {
            long elapsed = System.nanoTime() - t0;
            ObjectNode r = JSON.createObjectNode().put("entries", entries).put("elapsed_ns", elapsed)
                    .put("client_ticks", ticks("self") - self0).put("bookie_ticks", others() - others0);
            long[] machine = machine();
            return r.put("machine_busy_ticks", machine[0] - machine0[0]).put("steal_ticks", machine[1] - machine0[1]);
        }
    }

    static byte[] payload(int size) {
        byte[] b = new byte[size];
        new Random(size).nextBytes(b);
        return b;
    }

    static WriteHandle create(BookKeeper client) throws Exception {
        return createAsync(client).get();
    }

    static CompletableFuture<WriteHandle> createAsync(BookKeeper client) {
        return client.newCreateLedgerOp().withEnsembleSize(3).withWriteQuorumSize(3).withAckQuorumSize(2)
                .withDigestType(DigestType.CRC32C).withPassword(PASSWORD).execute();
    }

    static void putLatencies(ObjectNode r, long[] latencies, int n) {
        ArrayNode a = r.putArray("latencies_ns");
        for (int i = 0; i < n; i++) a.add(latencies[i]);
    }

    // --- workloads -----------------------------------------------------------------------
    /** One append at a time: warm-up seconds uncounted, then seconds counted. */
    static ObjectNode sequential(JsonNode cmd) throws Exception {
        byte[] data = payload(cmd.path("size").asInt());
        Meter meter = new Meter(cmd);
        WriteHandle h = create(bk);
        long counting = System.nanoTime() + (long) (cmd.path("warmup").asDouble() * 1e9);
        while (System.nanoTime() < counting) h.append(data);
        long[] latencies = new long[1 << 16];
        int n = 0;
        meter.start();
        long until = System.nanoTime() + (long) (cmd.path("seconds").asDouble() * 1e9);
        long start;
        while ((start = System.nanoTime()) < until) {
            h.append(data);
            if (n == latencies.length) latencies = java.util.Arrays.copyOf(latencies, n * 2);
            latencies[n++] = System.nanoTime() - start;
        }
        ObjectNode r = meter.stop(n);
        putLatencies(r, latencies, n);
        h.close();
        return r;
    }

    /**
     * Appends round-robin over `handles`, `inFlight` outstanding, for warm-up then seconds;
     * the adds acknowledged within the counted interval are counted.
     */
    static ObjectNode window(List<WriteHandle> handles, byte[] data, int inFlight, Meter meter, JsonNode cmd)
            throws Exception {
        Semaphore window = new Semaphore(inFlight);
        AtomicLong acked = new AtomicLong();
        AtomicReference<Throwable> failed = new AtomicReference<>();
        long counting = System.nanoTime() + (long) (cmd.path("warmup").asDouble() * 1e9);
        long until = counting + (long) (cmd.path("seconds").asDouble() * 1e9);
        boolean started = false;
        long before = 0;
        int next = 0;
        long now;
        while ((now = System.nanoTime()) < until && failed.get() == null) {
            if (!started && now >= counting) {
                started = true;
                before = acked.get();
                meter.start();
            }
            window.acquire();
            WriteHandle h = handles.get(next);
            next = (next + 1) % handles.size();
            h.appendAsync(data).whenComplete((id, t) -> {
                if (t != null) failed.compareAndSet(null, t);
                acked.incrementAndGet();
                window.release();
            });
        }
        ObjectNode r = meter.stop(acked.get() - before);
        window.acquire(inFlight);  // drain, uncounted
        if (failed.get() != null) throw new ExecutionException(failed.get());
        return r;
    }

    static ObjectNode pipelined(JsonNode cmd) throws Exception {
        WriteHandle h = create(bk);
        ObjectNode r = window(List.of(h), payload(cmd.path("size").asInt()), cmd.path("in_flight").asInt(),
                new Meter(cmd), cmd);
        h.close();
        return r;
    }

    /** A ledger of `entries` appends of `size` bytes (1,000 in flight), closed; its id. */
    static ObjectNode write(JsonNode cmd) throws Exception {
        byte[] data = payload(cmd.path("size").asInt());
        long entries = cmd.path("entries").asLong();
        WriteHandle h = create(bk);
        Semaphore window = new Semaphore(1000);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        for (long i = 0; i < entries; i++) {
            window.acquire();
            h.appendAsync(data).whenComplete((id, t) -> {
                if (t != null) failed.compareAndSet(null, t);
                window.release();
            });
        }
        window.acquire(1000);
        if (failed.get() != null) throw new ExecutionException(failed.get());
        h.close();
        return JSON.createObjectNode().put("ledger", h.getId()).put("entries", entries);
    }

    /** A closed ledger opened afresh and read from its first entry to its last, `batch` at a time. */
    static ObjectNode read(JsonNode cmd) throws Exception {
        int batch = cmd.path("batch").asInt(1000);
        Meter meter = new Meter(cmd);
        meter.start();
        ReadHandle h = bk.newOpenLedgerOp().withLedgerId(cmd.path("ledger").asLong()).withRecovery(false)
                .withDigestType(DigestType.CRC32C).withPassword(PASSWORD).execute().get();
        long last = h.getLastAddConfirmed(), entries = 0, bytes = 0;
        for (long first = 0; first <= last; first += batch) {
            try (LedgerEntries es = h.read(first, Math.min(last, first + batch - 1))) {
                for (LedgerEntry e : es) {
                    entries++;
                    bytes += e.getEntryBuffer().readableBytes();
                }
            }
        }
        ObjectNode r = meter.stop(entries).put("bytes", bytes);
        h.close();
        return r;
    }

    /**
     * Tail visibility: a writer appends `samples` + 1 entries, one at a time, `interval_ms`
     * apart; a reader on a client of its own follows the ledger with long polls
     * (readLastAddConfirmedAndEntry). Per entry, from the writer's append returning to the
     * reader holding the entry (the extra last entry is not counted: with the LAC carried by
     * the next add it may only become visible at the close).
     */
    static ObjectNode tail(JsonNode cmd) throws Exception {
        int samples = cmd.path("samples").asInt();
        long interval = cmd.path("interval_ms").asLong();
        byte[] data = payload(cmd.path("size").asInt(100));
        WriteHandle w = create(bk);
        w.append(data);  // entry 0: the reader opens once the ledger has an entry
        ReadHandle r = readerBk.newOpenLedgerOp().withLedgerId(w.getId()).withRecovery(false)
                .withDigestType(DigestType.CRC32C).withPassword(PASSWORD).execute().get();
        long[] acked = new long[samples + 1];
        long[] seen = new long[samples + 1];
        AtomicReference<Throwable> failed = new AtomicReference<>();
        Thread reader = new Thread(() -> follow(r, seen, samples, failed), "bench-tail");
        reader.start();
        for (int i = 0; i <= samples; i++) {
            w.append(data);  // entry i + 1
            acked[i] = System.nanoTime();
            if (interval > 0) Thread.sleep(interval);
        }
        reader.join(30_000);
        if (reader.isAlive()) {
            reader.interrupt();
            int got = 0;
            for (long t : seen) got += t > 0 ? 1 : 0;
            throw new IllegalStateException("the tailing reader saw " + got + " of " + samples + " entries in 30 s");
        }
        w.close();
        r.close();
        if (failed.get() != null) throw new ExecutionException(failed.get());
        long[] delays = new long[samples];
        for (int i = 0; i < samples; i++) delays[i] = Math.max(0, seen[i] - acked[i]);
        ObjectNode out = JSON.createObjectNode().put("entries", samples);
        putLatencies(out, delays, samples);
        return out;
    }

    static void follow(ReadHandle r, long[] seen, int samples, AtomicReference<Throwable> failed) {
        long next = 1;
        try {
            while (next <= samples) {
                try (LastConfirmedAndEntry le = r.readLastAddConfirmedAndEntry(next, 1000, parallelLongPoll)) {
                    long now = System.nanoTime();
                    if (le.hasEntry() && le.getEntry().getEntryId() == next) {
                        seen[(int) (next - 1)] = now;
                        next++;
                    }
                    long lac = le.getLastAddConfirmed();
                    if (lac >= next) {  // more confirmed than the poll brought: read them
                        try (LedgerEntries es = r.read(next, Math.min(lac, samples))) {
                            long at = System.nanoTime();
                            for (LedgerEntry e : es) seen[(int) (e.getEntryId() - 1)] = at;
                        }
                        next = Math.min(lac, samples) + 1;
                    }
                }
            }
        } catch (Throwable t) {
            failed.compareAndSet(null, t);
        }
    }

    /** `ledgers` ledgers created at once, then appends round-robin over them, `in_flight` outstanding. */
    static ObjectNode ledgers(JsonNode cmd) throws Exception {
        int count = cmd.path("ledgers").asInt();
        long t0 = System.nanoTime();
        List<CompletableFuture<WriteHandle>> creating = new ArrayList<>();
        for (int i = 0; i < count; i++) creating.add(createAsync(bk));
        List<WriteHandle> handles = new ArrayList<>();
        for (CompletableFuture<WriteHandle> f : creating) handles.add(f.get());
        long created = System.nanoTime() - t0;
        ObjectNode r = window(handles, payload(cmd.path("size").asInt()), cmd.path("in_flight").asInt(),
                new Meter(cmd), cmd);
        List<CompletableFuture<Void>> closing = new ArrayList<>();
        for (WriteHandle h : handles) closing.add(h.closeAsync());
        for (CompletableFuture<Void> f : closing) f.get();
        return r.put("ledgers", count).put("create_ns", created);
    }
}
