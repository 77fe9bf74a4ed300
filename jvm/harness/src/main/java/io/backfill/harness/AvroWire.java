package io.backfill.harness;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/**
 * Avro in the schema registry's wire format, with Apache Avro alone: a magic byte {@code 0}, the writer's schema
 * id as 4 bytes big-endian, then the Avro binary payload. The schemas come from a folder of {@code <id>.avsc}
 * files (what the registry's {@code GET /schemas/ids/N} answers, saved), so no registry client is needed.
 * Reading takes the writer schema by the record's id and reads the value as that schema; writing uses one
 * schema and its id.
 */
final class AvroWire {
    private final Path folder;
    private final Map<Integer, Schema> schemas = new ConcurrentHashMap<>();

    AvroWire(Path folder) {
        this.folder = folder;
    }

    /** The schema of id {@code id}: {@code <folder>/<id>.avsc}. */
    Schema schema(int id) {
        return schemas.computeIfAbsent(id, i -> {
            try {
                return new Schema.Parser().parse(Files.readString(folder.resolve(i + ".avsc")));
            } catch (IOException e) {
                throw new UncheckedIOException("no schema " + i + " in " + folder, e);
            }
        });
    }

    /** Writes values of the schema of {@code id}, the header first. */
    <T> Serializer<T> serializer(int id) {
        Schema schema = schema(id);
        GenericDatumWriter<T> writer = new GenericDatumWriter<>(schema);
        return (topic, data) -> {
            if (data == null) {
                return null;
            }
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            out.write(0);
            out.writeBytes(ByteBuffer.allocate(4).putInt(id).array());
            BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(out, null);
            try {
                writer.write(data, encoder);
                encoder.flush();
            } catch (IOException | RuntimeException e) {
                throw new SerializationException("cannot write " + data + " as schema " + id, e);
            }
            return out.toByteArray();
        };
    }

    /** Reads a value of any schema id in the folder, as its writer schema. */
    <T> Deserializer<T> deserializer() {
        Map<Integer, GenericDatumReader<T>> readers = new ConcurrentHashMap<>();
        return (topic, data) -> {
            if (data == null) {
                return null;
            }
            if (data.length < 5 || data[0] != 0) {
                throw new SerializationException("no schema registry header (magic byte 0, 4-byte id)");
            }
            int id = ByteBuffer.wrap(data, 1, 4).getInt();
            GenericDatumReader<T> reader = readers.computeIfAbsent(id, i -> new GenericDatumReader<>(schema(i)));
            try {
                return reader.read(null, DecoderFactory.get().binaryDecoder(data, 5, data.length - 5, null));
            } catch (IOException | RuntimeException e) {
                throw new SerializationException("the payload does not decode as schema " + id, e);
            }
        };
    }

    /** An Avro {@code "string"} key as a Java String: read as any writer id, written as {@code id}. */
    Serde<String> strings(int id) {
        Serializer<CharSequence> write = serializer(id);
        Deserializer<Object> read = deserializer();
        return Serdes.serdeFrom((topic, text) -> write.serialize(topic, text), (topic, data) -> {
            Object value = read.deserialize(topic, data);
            return value == null ? null : value.toString();  // Avro reads a string as Utf8
        });
    }
}
