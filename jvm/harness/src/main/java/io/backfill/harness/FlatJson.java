package io.backfill.harness;

import java.util.HashMap;
import java.util.Map;

/**
 * Reads one field of a flat JSON object (strings, numbers, booleans, null; no nesting): enough for the
 * demo's click values without a JSON library on the judged classpath.
 */
final class FlatJson {
    private FlatJson() {
    }

    static String text(String json, String field) {
        Object v = parse(json).get(field);
        return v == null ? null : v.toString();
    }

    static Double number(String json, String field) {
        Object v = parse(json).get(field);
        return v instanceof Double d ? d : null;
    }

    /** Field name to String, Double, Boolean or null. */
    static Map<String, Object> parse(String json) {
        Map<String, Object> out = new HashMap<>();
        int[] at = {skip(json, 0)};
        expect(json, at, '{');
        if (peek(json, at) == '}') {
            return out;
        }
        while (true) {
            String name = string(json, at);
            expect(json, at, ':');
            out.put(name, value(json, at));
            char c = peek(json, at);
            at[0]++;
            if (c == '}') {
                return out;
            }
            if (c != ',') {
                throw new IllegalArgumentException("not a flat JSON object: " + json);
            }
        }
    }

    private static Object value(String s, int[] at) {
        char c = peek(s, at);
        if (c == '"') {
            return string(s, at);
        }
        int start = at[0];
        while (at[0] < s.length() && ",}] \t\r\n".indexOf(s.charAt(at[0])) < 0) {
            at[0]++;
        }
        String word = s.substring(start, at[0]);
        return switch (word) {
            case "null" -> null;
            case "true" -> Boolean.TRUE;
            case "false" -> Boolean.FALSE;
            default -> Double.valueOf(word);
        };
    }

    private static String string(String s, int[] at) {
        expect(s, at, '"');
        StringBuilder b = new StringBuilder();
        while (true) {
            char c = s.charAt(at[0]++);
            if (c == '"') {
                return b.toString();
            }
            if (c != '\\') {
                b.append(c);
                continue;
            }
            char e = s.charAt(at[0]++);
            switch (e) {
                case 'n' -> b.append('\n');
                case 't' -> b.append('\t');
                case 'r' -> b.append('\r');
                case 'b' -> b.append('\b');
                case 'f' -> b.append('\f');
                case 'u' -> {
                    b.append((char) Integer.parseInt(s.substring(at[0], at[0] + 4), 16));
                    at[0] += 4;
                }
                default -> b.append(e);
            }
        }
    }

    private static void expect(String s, int[] at, char c) {
        if (peek(s, at) != c) {
            throw new IllegalArgumentException("expected '" + c + "' at " + at[0] + ": " + s);
        }
        at[0]++;
    }

    private static char peek(String s, int[] at) {
        at[0] = skip(s, at[0]);
        return s.charAt(at[0]);
    }

    private static int skip(String s, int i) {
        while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
            i++;
        }
        return i;
    }
}
