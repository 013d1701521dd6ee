package dev.riffle.registry;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.InvalidProtocolBufferException;
import com.squareup.wire.schema.internal.parser.ProtoFileElement;
import com.squareup.wire.schema.internal.parser.ProtoParser;
import io.apicurio.registry.utils.protobuf.schema.FileDescriptorUtils;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.util.Base64;
import java.util.regex.Pattern;
import javax.ws.rs.container.ContainerRequestContext;
import javax.ws.rs.container.ContainerRequestFilter;
import javax.ws.rs.container.ContainerResponseContext;
import javax.ws.rs.container.ContainerResponseFilter;
import javax.ws.rs.core.MediaType;
import javax.ws.rs.core.Response;
import javax.ws.rs.ext.Provider;
import org.apache.avro.Schema;

/**
 * Brings Apicurio 2.4's Confluent-compatible API (/apis/ccompat) closer to Confluent's registry
 * where clients notice:
 * <ul>
 *   <li>Schemas sent to register, look up or check (POST) are normalized as Confluent does before
 *       they are compared or stored: Avro to Avro's own JSON form ({@code Schema.toString()}: no
 *       whitespace, field order kept), Protobuf to Wire's .proto text, so the same schema written
 *       differently gets the same id. (Apicurio's own "canonical hash" mode is not used: it sorts
 *       Avro fields, which changes the schema.) A base64 FileDescriptorProto, what confluent-kafka's
 *       Python and Go serializers send, becomes .proto text. An Avro schema without references that
 *       Avro cannot parse, or .proto text Wire cannot parse, is refused with 422 / 42201.</li>
 *   <li>{@code ?format=serialized} on a GET answers a Protobuf schema as a base64
 *       FileDescriptorProto (Apicurio ignores the parameter; confluent-kafka's Python deserializer
 *       needs it). Only for schemas that import nothing but Google's well-known types: with
 *       references to other subjects the text is returned unchanged.</li>
 *   <li>An incompatible schema's 409 carries error_code 409 (Apicurio sends 0).</li>
 * </ul>
 */
@Provider
public class ConfluentSchemas implements ContainerRequestFilter, ContainerResponseFilter {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Pattern BASE64 = Pattern.compile("[A-Za-z0-9+/=\\s]+");
    private static final MediaType CCOMPAT_JSON = MediaType.valueOf("application/vnd.schemaregistry.v1+json");

    private static boolean ccompat(ContainerRequestContext request) {
        return request.getUriInfo().getPath().contains("ccompat/");
    }

    @Override
    public void filter(ContainerRequestContext request) throws IOException {
        if (!"POST".equals(request.getMethod()) || !ccompat(request) || !request.hasEntity()) {
            return;
        }
        byte[] body = request.getEntityStream().readAllBytes();
        request.setEntityStream(new ByteArrayInputStream(body));
        JsonNode tree;
        try {
            tree = JSON.readTree(body);
        } catch (IOException notJson) {
            return; // Apicurio answers that itself.
        }
        if (!(tree instanceof ObjectNode) || !tree.path("schema").isTextual()) {
            return;
        }
        String type = tree.path("schemaType").asText("AVRO");
        if (type.isEmpty()) {
            type = "AVRO";
        }
        String schema = tree.path("schema").asText();
        String normalized;
        try {
            if ("AVRO".equals(type)) {
                if (tree.path("references").size() > 0) {
                    return; // Named types from other subjects: Avro cannot parse it alone.
                }
                normalized = new Schema.Parser().parse(schema).toString();
            } else if ("PROTOBUF".equals(type)) {
                String fromDescriptor = protoText(schema);
                normalized = fromDescriptor != null ? fromDescriptor
                        : ProtoParser.Companion.parse(FileDescriptorUtils.DEFAULT_LOCATION, schema).toSchema();
            } else {
                return;
            }
        } catch (RuntimeException invalid) {
            ObjectNode error = JSON.createObjectNode();
            error.put("error_code", 42201);
            error.put("message", "Invalid schema: " + invalid.getMessage());
            request.abortWith(Response.status(422).type(CCOMPAT_JSON)
                    .entity(JSON.writeValueAsString(error)).build());
            return;
        }
        ((ObjectNode) tree).put("schema", normalized);
        request.setEntityStream(new ByteArrayInputStream(JSON.writeValueAsBytes(tree)));
    }

    /** The .proto text of a base64 FileDescriptorProto, or null when `schema` is not one. */
    private static String protoText(String schema) {
        if (schema.isEmpty() || !BASE64.matcher(schema).matches()) {
            return null;
        }
        try {
            FileDescriptorProto file = FileDescriptorProto.parseFrom(Base64.getMimeDecoder().decode(schema));
            if (file.getMessageTypeCount() == 0 && file.getEnumTypeCount() == 0) {
                return null;
            }
            return FileDescriptorUtils.fileDescriptorToProtoFile(file).toSchema();
        } catch (IllegalArgumentException | InvalidProtocolBufferException notBase64) {
            return null;
        }
    }

    @Override
    public void filter(ContainerRequestContext request, ContainerResponseContext response)
            throws IOException {
        if (!ccompat(request) || !response.hasEntity()) {
            return;
        }
        if (response.getStatus() == 409) {
            JsonNode error = JSON.valueToTree(response.getEntity());
            if (error instanceof ObjectNode && error.path("error_code").asInt() == 0) {
                ((ObjectNode) error).put("error_code", 409);
                response.setEntity(JSON.writeValueAsString(error), null, response.getMediaType());
            }
            return;
        }
        String format = request.getUriInfo().getQueryParameters().getFirst("format");
        if (response.getStatus() != 200 || !"GET".equals(request.getMethod())
                || !"serialized".equals(format)) {
            return;
        }
        JsonNode tree = JSON.valueToTree(response.getEntity());
        if (!(tree instanceof ObjectNode) || !"PROTOBUF".equals(tree.path("schemaType").asText())
                || tree.path("references").size() > 0) {
            return;
        }
        String schema = tree.path("schema").asText();
        if (protoText(schema) != null) {
            return; // Already a serialized descriptor.
        }
        try {
            ProtoFileElement file = ProtoParser.Companion.parse(FileDescriptorUtils.DEFAULT_LOCATION, schema);
            byte[] serialized = FileDescriptorUtils.protoFileToFileDescriptor(file).toProto().toByteArray();
            ((ObjectNode) tree).put("schema", Base64.getEncoder().encodeToString(serialized));
            response.setEntity(JSON.writeValueAsString(tree), null, response.getMediaType());
        } catch (Exception unresolvable) {
            // Left as text: the client reports what it cannot read.
        }
    }
}
