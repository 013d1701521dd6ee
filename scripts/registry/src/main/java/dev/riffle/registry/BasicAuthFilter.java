package dev.riffle.registry;

import io.vertx.ext.web.Router;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.Base64;
import java.util.Optional;
import javax.enterprise.context.ApplicationScoped;
import javax.enterprise.event.Observes;
import org.eclipse.microprofile.config.inject.ConfigProperty;

/**
 * HTTP basic auth for the registry's HTTPS listener (or every listener with
 * riffle.registry.auth-on=all) when riffle.registry.user is set at start-up: one server then
 * answers plain, unauthenticated HTTP and authenticated HTTPS, like the test broker's two
 * listeners. Apicurio's own auth needs an OIDC server, and Quarkus' permission policies are
 * fixed at build time; this filter is configured per run.
 */
@ApplicationScoped
public class BasicAuthFilter {
    @ConfigProperty(name = "riffle.registry.user")
    Optional<String> user;

    @ConfigProperty(name = "riffle.registry.password")
    Optional<String> password;

    /** "https" (only TLS connections must authenticate) or "all". */
    @ConfigProperty(name = "riffle.registry.auth-on", defaultValue = "https")
    String authOn;

    void install(@Observes Router router) {
        if (user.isEmpty() || user.get().isEmpty()) {
            return;
        }
        boolean everywhere = "all".equals(authOn);
        String credentials = user.get() + ":" + password.orElse("");
        byte[] expected = ("Basic " + Base64.getEncoder()
                .encodeToString(credentials.getBytes(StandardCharsets.UTF_8)))
                .getBytes(StandardCharsets.UTF_8);
        // Before every other route, the registry's REST resources included.
        router.route().order(Integer.MIN_VALUE).handler(ctx -> {
            if (!everywhere && !ctx.request().isSSL()) {
                ctx.next();
                return;
            }
            String got = ctx.request().getHeader("Authorization");
            if (got != null && MessageDigest.isEqual(got.getBytes(StandardCharsets.UTF_8), expected)) {
                ctx.next();
                return;
            }
            ctx.response()
                    .setStatusCode(401)
                    .putHeader("WWW-Authenticate", "Basic realm=\"riffle-registry\"")
                    .putHeader("Content-Type", "application/vnd.schemaregistry.v1+json")
                    .end("{\"error_code\":40101,\"message\":\"Unauthorized: HTTP basic auth with the"
                            + " registry's user and password is required\"}");
        });
    }
}
