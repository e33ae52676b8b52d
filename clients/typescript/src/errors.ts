/** Errors of the sandpit control API as classes, one per status the API answers. */

/** An API call failed: `status` is the HTTP status (0: no answer), `message` the API's. */
export class SandpitError extends Error {
  readonly status: number;
  readonly apiMessage: string;
  readonly method: string;
  readonly path: string;
  constructor(status: number, message: string, method = "", path = "") {
    super(`sandpit API ${method ? `${method} ${path}: ` : ""}${status} ${message}`);
    this.name = new.target.name;
    this.status = status;
    this.apiMessage = message;
    this.method = method;
    this.path = path;
  }
}
/** 400: a bad body, query or value over its ceiling. */
export class BadRequestError extends SandpitError {}
/** 401: missing or wrong key (or token, for /mcp). */
export class UnauthorizedError extends SandpitError {}
/** 403: the key lacks the right. */
export class ForbiddenError extends SandpitError {}
/** 404: unknown token, golden or review. */
export class NotFoundError extends SandpitError {}
/** 409: the decision or promotion is not allowed now. */
export class ConflictError extends SandpitError {}
/** 5xx: the gateway failed (501: not offered by its provider). */
export class ServerError extends SandpitError {}
/** The gateway did not answer. */
export class SandpitConnectionError extends SandpitError {}

const BY_STATUS: Record<number, typeof SandpitError> = {
  400: BadRequestError,
  401: UnauthorizedError,
  403: ForbiddenError,
  404: NotFoundError,
  409: ConflictError,
};

/** The error class for `status`, built. */
export function errorFor(status: number, message: string, method: string, path: string): SandpitError {
  if (status === 0) return new SandpitConnectionError(status, message, method, path);
  const Cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : SandpitError);
  return new Cls(status, message, method, path);
}
