// A test peer driving the Apache BookKeeper 4.18.2 Java client: one JSON command per line
// on stdin, one JSON result per line on stdout (tests/support/bookkeeper.py, JavaPeer).
// Logs go to stderr. Errors: {"error": "<BKException code name>", "message": ...}.
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.bookkeeper.client.BKException;
import org.apache.bookkeeper.client.api.BookKeeper;
import org.apache.bookkeeper.client.api.DigestType;
import org.apache.bookkeeper.client.api.LastConfirmedAndEntry;
import org.apache.bookkeeper.client.api.LedgerEntries;
import org.apache.bookkeeper.client.api.LedgerEntry;
import org.apache.bookkeeper.client.api.ReadHandle;
import org.apache.bookkeeper.client.api.WriteHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

public class Peer {
    static final ObjectMapper JSON = new ObjectMapper();
    static PrintStream out;
    static final Map<Long, WriteHandle> writers = new HashMap<>();
    static final Map<Long, ReadHandle> readers = new HashMap<>();
    static BookKeeper bk;

    public static void main(String[] args) throws Exception {
        out = new PrintStream(System.out, true, "UTF-8");
        System.setOut(System.err);  // before any BookKeeper class logs to "stdout"
        String uri = args[0];
        boolean v2 = args.length > 1 && args[1].equals("v2");
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(uri);
        conf.setUseV2WireProtocol(v2);
        conf.setAddEntryTimeout(10);
        conf.setReadEntryTimeout(10);
        for (int i = 2; i < args.length; i++) {  // more client settings, key=value (TLS, for one)
            int eq = args[i].indexOf('=');
            conf.setProperty(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        bk = BookKeeper.newBuilder(conf).build();
        emit(JSON.createObjectNode().put("ready", true).put("v2", v2));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            JsonNode cmd = JSON.readTree(line);
            ObjectNode result;
            try {
                result = run(cmd);
            } catch (Throwable t) {
                result = error(t);
            }
            result.put("id", cmd.path("id").asLong());
            emit(result);
        }
        out.flush();
        Runtime.getRuntime().halt(0);  // bk.close() waits ~4 s for Netty's quiet period; tests close their ledgers
    }

    static synchronized void emit(ObjectNode node) throws Exception {
        out.println(JSON.writeValueAsString(node));
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

    static byte[] payload(JsonNode cmd, int i) {
        JsonNode given = cmd.path("payloads");
        if (given.isArray()) return Base64.getDecoder().decode(given.get(i).asText());
        int size = cmd.path("size").asInt(100);
        long seed = cmd.path("seed").asLong(0) * 1_000_003L + i;
        byte[] b = new byte[size];
        for (int k = 0; k < size; k++) {
            seed = seed * 6364136223846793005L + 1442695040888963407L;
            b[k] = (byte) (seed >>> 56);
        }
        return b;
    }

    static ReadHandle reader(long id) {
        ReadHandle h = writers.get(id);
        return h != null ? h : readers.get(id);
    }

    static ObjectNode entries(LedgerEntries es) {
        ObjectNode r = JSON.createObjectNode();
        ArrayNode ids = r.putArray("entries");
        ArrayNode data = r.putArray("payloads");
        for (LedgerEntry e : es) {
            ids.add(e.getEntryId());
            data.add(Base64.getEncoder().encodeToString(e.getEntryBytes()));
        }
        es.close();
        return r;
    }

    static ObjectNode run(JsonNode cmd) throws Exception {
        String op = cmd.path("op").asText();
        long lid = cmd.path("ledger").asLong(-1);
        ObjectNode r = JSON.createObjectNode();
        switch (op) {
            case "create": {
                WriteHandle h = bk.newCreateLedgerOp()
                        .withEnsembleSize(cmd.path("ensemble").asInt(3))
                        .withWriteQuorumSize(cmd.path("write_quorum").asInt(3))
                        .withAckQuorumSize(cmd.path("ack_quorum").asInt(2))
                        .withDigestType(DigestType.valueOf(cmd.path("digest").asText("CRC32C")))
                        .withPassword(cmd.path("password").asText("").getBytes(StandardCharsets.UTF_8))
                        .execute().get();
                writers.put(h.getId(), h);
                return r.put("ledger", h.getId());
            }
            case "add": {
                WriteHandle h = writers.get(lid);
                int count = cmd.path("count").asInt(1);
                boolean pipelined = cmd.path("pipelined").asBoolean(true);
                boolean report = cmd.path("report").asBoolean(false);
                List<CompletableFuture<Long>> pending = new ArrayList<>();
                ArrayNode ids = r.putArray("entries");
                for (int i = 0; i < count; i++) {
                    CompletableFuture<Long> f = h.appendAsync(payload(cmd, i));
                    if (report) {
                        f.thenAccept(e -> {
                            try { emit(JSON.createObjectNode().put("ack", e).put("ledger", lid)); }
                            catch (Exception ignored) { }
                        });
                    }
                    if (pipelined) pending.add(f); else ids.add(f.get());
                }
                for (CompletableFuture<Long> f : pending) ids.add(f.get());
                return r;
            }
            case "open": {
                ReadHandle h = bk.newOpenLedgerOp().withLedgerId(lid)
                        .withRecovery(cmd.path("recovery").asBoolean(false))
                        .withDigestType(DigestType.valueOf(cmd.path("digest").asText("CRC32C")))
                        .withPassword(cmd.path("password").asText("").getBytes(StandardCharsets.UTF_8))
                        .execute().get();
                readers.put(lid, h);
                return r.put("ledger", lid).put("lac", h.getLastAddConfirmed()).put("closed", h.isClosed())
                        .put("length", h.getLength());
            }
            case "read": {
                return entries(reader(lid).read(cmd.path("first").asLong(), cmd.path("last").asLong()));
            }
            case "read_lac": {
                return r.put("lac", reader(lid).readLastAddConfirmed());
            }
            case "tail": {  // one long poll: wait up to timeout_ms for entry `entry`
                LastConfirmedAndEntry le = reader(lid).readLastAddConfirmedAndEntry(
                        cmd.path("entry").asLong(), cmd.path("timeout_ms").asLong(1000), false);
                r.put("lac", le.getLastAddConfirmed());
                if (le.hasEntry()) {
                    r.put("entry", le.getEntry().getEntryId());
                    r.put("payload", Base64.getEncoder().encodeToString(le.getEntry().getEntryBytes()));
                }
                le.close();
                return r;
            }
            case "close": {
                ReadHandle h = writers.containsKey(lid) ? writers.remove(lid) : readers.remove(lid);
                h.close();
                return r.put("ledger", lid);
            }
            case "delete": {
                bk.newDeleteLedgerOp().withLedgerId(lid).execute().get();
                return r.put("ledger", lid);
            }
            case "list": {
                ArrayNode ids = r.putArray("ledgers");
                for (long id : bk.newListLedgersOp().execute().get().toIterable()) ids.add(id);
                return r;
            }
            default:
                return r.put("error", "UnknownCommand").put("message", op);
        }
    }
}
