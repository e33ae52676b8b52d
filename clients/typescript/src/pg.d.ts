// Minimal ambient declaration: pg is an optional peer and this package ships without @types/pg;
// tool.ts types the few calls it makes itself.
declare module "pg" {
  const pg: unknown;
  export default pg;
}
