package org.apache.iceberg.rest;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.SupportsNamespaces;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.catalog.ViewCatalog;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.exceptions.BadRequestException;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.exceptions.ForbiddenException;
import org.apache.iceberg.exceptions.NamespaceNotEmptyException;
import org.apache.iceberg.exceptions.NoSuchNamespaceException;
import org.apache.iceberg.exceptions.NoSuchTableException;
import org.apache.iceberg.exceptions.NoSuchViewException;
import org.apache.iceberg.exceptions.NotAuthorizedException;
import org.apache.iceberg.exceptions.NotFoundException;
import org.apache.iceberg.exceptions.UnprocessableEntityException;
import org.apache.iceberg.exceptions.ValidationException;
import org.apache.iceberg.rest.requests.CreateNamespaceRequest;
import org.apache.iceberg.rest.requests.CreateTableRequest;
import org.apache.iceberg.rest.requests.RegisterTableRequest;
import org.apache.iceberg.rest.requests.RenameTableRequest;
import org.apache.iceberg.rest.requests.UpdateNamespacePropertiesRequest;
import org.apache.iceberg.rest.requests.UpdateTableRequest;
import org.apache.iceberg.rest.responses.ConfigResponse;
import org.apache.iceberg.rest.responses.ErrorResponse;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The Iceberg REST catalog protocol answered by Iceberg's own server-side handlers
 * ({@link CatalogHandlers}) over JDBC catalogs: this class only routes HTTP requests to them and
 * turns their exceptions into the protocol's error responses, as Iceberg's own test fixture does.
 *
 * <p>{@code GET /v1/config?warehouse=NAME} opens (once) a {@code JdbcCatalog} named NAME on the JDBC
 * database given at start, with its warehouse under the root folder given at start, and answers the
 * prefix NAME: every later request of that client goes to {@code /v1/NAME/...}. Several catalogs
 * (one per test) share one server; a JDBC catalog's rows are keyed by its name, so a SQL catalog of
 * another engine with the same name and database sees the same tables.
 *
 * <p>The config names no endpoints: Iceberg's {@code Endpoint} needs the shaded HTTP client classes,
 * which the runtime jar leaves out (as it does its shaded Jackson), so clients assume the protocol's
 * standard set.
 *
 * <p>Arguments: PORT_FILE JDBC_URI WAREHOUSE_ROOT [JDBC_PROPERTY=VALUE ...]. The server binds a free
 * loopback port and writes it to PORT_FILE.
 */
public class RestCatalogServer {
  private static final ObjectMapper MAPPER = RESTObjectMapper.mapper();
  private final String jdbcUri;
  private final String warehouseRoot;
  private final Map<String, String> jdbcProperties;
  private final Map<String, Catalog> catalogs = new ConcurrentHashMap<>();

  RestCatalogServer(String jdbcUri, String warehouseRoot, Map<String, String> jdbcProperties) {
    this.jdbcUri = jdbcUri;
    this.warehouseRoot = warehouseRoot;
    this.jdbcProperties = jdbcProperties;
  }

  public static void main(String[] args) throws IOException {
    Map<String, String> jdbc = new HashMap<>();
    for (String arg : Arrays.copyOfRange(args, 3, args.length)) {
      String[] pair = arg.split("=", 2);
      jdbc.put(pair[0], pair[1]);
    }
    RestCatalogServer handlers = new RestCatalogServer(args[1], args[2], jdbc);
    HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 64);
    server.createContext("/v1/", handlers::handle);
    server.setExecutor(Executors.newFixedThreadPool(8));
    server.start();
    Path portFile = Paths.get(args[0]);
    Path partial = Paths.get(args[0] + ".partial");
    Files.write(partial, Integer.toString(server.getAddress().getPort()).getBytes(StandardCharsets.UTF_8));
    Files.move(partial, portFile);
  }

  private Catalog catalog(String name) {
    return catalogs.computeIfAbsent(name, key -> {
      Map<String, String> props = new HashMap<>(jdbcProperties);
      props.put("uri", jdbcUri);
      props.put("warehouse", "file:" + warehouseRoot + "/" + key);
      props.put("jdbc.schema-version", "V1");
      return CatalogUtil.loadCatalog("org.apache.iceberg.jdbc.JdbcCatalog", key, props, new Configuration());
    });
  }

  private void handle(HttpExchange exchange) throws IOException {
    String method = exchange.getRequestMethod();
    try {
      String[] parts = exchange.getRequestURI().getRawPath().substring("/v1/".length()).split("/");
      Map<String, String> query = query(exchange.getRequestURI().getRawQuery());
      byte[] body = readAll(exchange.getRequestBody());
      if (parts.length == 1 && parts[0].equals("config")) {
        String name = query.get("warehouse");
        if (name == null || name.isEmpty()) {
          throw new BadRequestException("this server needs a warehouse (a catalog name) in the client's configuration");
        }
        catalog(name);
        respond(exchange, 200, ConfigResponse.builder().withOverride("prefix", name).build());
        return;
      }
      Catalog catalog = catalogs.get(RESTUtil.decodeString(parts[0]));
      if (catalog == null) {
        throw new NotFoundException("unknown catalog prefix %s: ask /v1/config first", parts[0]);
      }
      route(exchange, method, Arrays.copyOfRange(parts, 1, parts.length), query, body, catalog);
    } catch (RuntimeException e) {
      error(exchange, method, e);
    } catch (Error e) {  // a missing class or the like: answer it, or the client waits forever
      error(exchange, method, new RuntimeException(e));
    }
  }

  private void route(HttpExchange exchange, String method, String[] path, Map<String, String> query, byte[] body,
                     Catalog catalog) throws IOException {
    SupportsNamespaces namespaces = (SupportsNamespaces) catalog;
    String route = method + " " + String.join("/", shape(path));
    Namespace ns = path.length > 1 && path[0].equals("namespaces") ? RESTUtil.decodeNamespace(path[1]) : null;
    TableIdentifier table = path.length > 3 ? TableIdentifier.of(ns, RESTUtil.decodeString(path[3])) : null;
    switch (route) {
      case "GET namespaces":
        Namespace parent = query.containsKey("parent") ? Namespace.of(query.get("parent").split("\u001f")) : Namespace.empty();
        respond(exchange, 200, CatalogHandlers.listNamespaces(namespaces, parent));
        return;
      case "POST namespaces":
        respond(exchange, 200, CatalogHandlers.createNamespace(namespaces, read(body, CreateNamespaceRequest.class)));
        return;
      case "GET namespaces/NS":
        respond(exchange, 200, CatalogHandlers.loadNamespace(namespaces, ns));
        return;
      case "HEAD namespaces/NS":
        CatalogHandlers.namespaceExists(namespaces, ns);
        respond(exchange, 204, null);
        return;
      case "DELETE namespaces/NS":
        CatalogHandlers.dropNamespace(namespaces, ns);
        respond(exchange, 204, null);
        return;
      case "POST namespaces/NS/properties":
        respond(exchange, 200, CatalogHandlers.updateNamespaceProperties(
            namespaces, ns, read(body, UpdateNamespacePropertiesRequest.class)));
        return;
      case "GET namespaces/NS/tables":
        respond(exchange, 200, CatalogHandlers.listTables(catalog, ns));
        return;
      case "POST namespaces/NS/tables":
        CreateTableRequest create = read(body, CreateTableRequest.class);
        respond(exchange, 200, create.stageCreate()
            ? CatalogHandlers.stageTableCreate(catalog, ns, create) : CatalogHandlers.createTable(catalog, ns, create));
        return;
      case "POST namespaces/NS/register":
        respond(exchange, 200, CatalogHandlers.registerTable(catalog, ns, read(body, RegisterTableRequest.class)));
        return;
      case "GET namespaces/NS/views":
        respond(exchange, 200, CatalogHandlers.listViews((ViewCatalog) catalog, ns));
        return;
      case "GET namespaces/NS/tables/T":
        respond(exchange, 200, CatalogHandlers.loadTable(catalog, table));
        return;
      case "HEAD namespaces/NS/tables/T":
        CatalogHandlers.tableExists(catalog, table);
        respond(exchange, 204, null);
        return;
      case "POST namespaces/NS/tables/T":
        respond(exchange, 200, CatalogHandlers.updateTable(catalog, table, read(body, UpdateTableRequest.class)));
        return;
      case "DELETE namespaces/NS/tables/T":
        if (Boolean.parseBoolean(query.getOrDefault("purgeRequested", "false"))) {
          CatalogHandlers.purgeTable(catalog, table);
        } else {
          CatalogHandlers.dropTable(catalog, table);
        }
        respond(exchange, 204, null);
        return;
      case "POST namespaces/NS/tables/T/metrics":
        respond(exchange, 204, null);
        return;
      case "POST tables/rename":
        CatalogHandlers.renameTable(catalog, read(body, RenameTableRequest.class));
        respond(exchange, 204, null);
        return;
      default:
        throw new UnsupportedOperationException("no route " + route);
    }
  }

  /** The route's shape: namespace and table segments replaced by NS and T. */
  private static String[] shape(String[] path) {
    String[] shape = path.clone();
    if (shape.length > 1 && shape[0].equals("namespaces")) {
      shape[1] = "NS";
      if (shape.length > 3 && (shape[2].equals("tables") || shape[2].equals("views"))) {
        shape[3] = "T";
      }
    }
    return shape;
  }

  private static <T> T read(byte[] body, Class<T> type) throws IOException {
    T request = MAPPER.readValue(body, type);
    if (request instanceof RESTRequest) {
      ((RESTRequest) request).validate();
    }
    return request;
  }

  private static void respond(HttpExchange exchange, int code, Object response) throws IOException {
    if (response == null || exchange.getRequestMethod().equals("HEAD")) {
      exchange.sendResponseHeaders(code, -1);
      exchange.close();
      return;
    }
    byte[] bytes = MAPPER.writeValueAsBytes(response);
    exchange.getResponseHeaders().set("Content-Type", "application/json");
    exchange.sendResponseHeaders(code, bytes.length);
    try (OutputStream out = exchange.getResponseBody()) {
      out.write(bytes);
    }
  }

  /** The protocol's status for each exception, as Iceberg's own REST test fixture maps them. */
  private static int status(RuntimeException e) {
    if (e instanceof NoSuchNamespaceException || e instanceof NoSuchTableException || e instanceof NoSuchViewException
        || e instanceof NotFoundException) {
      return 404;
    }
    if (e instanceof AlreadyExistsException || e instanceof CommitFailedException || e instanceof NamespaceNotEmptyException) {
      return 409;
    }
    if (e instanceof IllegalArgumentException || e instanceof ValidationException || e instanceof BadRequestException) {
      return 400;
    }
    if (e instanceof NotAuthorizedException) {
      return 401;
    }
    if (e instanceof ForbiddenException) {
      return 403;
    }
    if (e instanceof UnsupportedOperationException) {
      return 406;
    }
    if (e instanceof UnprocessableEntityException) {
      return 422;
    }
    return 500;
  }

  private static void error(HttpExchange exchange, String method, RuntimeException e) throws IOException {
    int code = status(e);
    if (code == 500) {
      e.printStackTrace();
    }
    ErrorResponse response = ErrorResponse.builder().responseCode(code).withType(e.getClass().getSimpleName())
        .withMessage(String.valueOf(e.getMessage())).build();
    respond(exchange, code, method.equals("HEAD") ? null : response);
  }

  private static Map<String, String> query(String raw) {
    Map<String, String> result = new HashMap<>();
    if (raw != null) {
      for (String pair : raw.split("&")) {
        String[] kv = pair.split("=", 2);
        result.put(URLDecoder.decode(kv[0], StandardCharsets.UTF_8),
            kv.length > 1 ? URLDecoder.decode(kv[1], StandardCharsets.UTF_8) : "");
      }
    }
    return result;
  }

  private static byte[] readAll(InputStream in) throws IOException {
    try (in) {
      return in.readAllBytes();
    }
  }
}
